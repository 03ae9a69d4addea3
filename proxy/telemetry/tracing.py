"""OpenTelemetry traces of client requests and of the upstream requests kipside makes for them.

One SERVER span per traced client request (Kafka messaging semantic conventions), one CLIENT
span per coalesced upstream ProduceRequest with a link to every member's request span, and span
events for transaction-begin holds and locally answered transaction calls. Export is OTLP
(http/protobuf) when an endpoint is configured, one compact line per span on stdout with
`--trace-console` (`span_line`), and nothing otherwise: with no exporter the tracer is None and
the hot path pays one attribute check.
This module must never block the proxy: spans are exported by the SDK's batch processor thread.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from kipside.protocol import ApiKey, api_name
from kipside.rules import Tracing

log = logging.getLogger("kipside.tracing")

OTLP_TIMEOUT_SECONDS: Final = 2.0

# Kafka operation names for the messaging.operation.* attributes.
_OPERATIONS: Final[dict[int, tuple[str, str]]] = {
    ApiKey.PRODUCE: ("send", "send"),
    ApiKey.FETCH: ("receive", "receive"),
    ApiKey.ADD_PARTITIONS_TO_TXN: ("add_partitions_to_txn", "settle"),
    ApiKey.ADD_OFFSETS_TO_TXN: ("add_offsets_to_txn", "settle"),
    ApiKey.END_TXN: ("end_txn", "settle"),
    ApiKey.TXN_OFFSET_COMMIT: ("txn_offset_commit", "settle"),
    ApiKey.INIT_PRODUCER_ID: ("init_producer_id", "settle"),
}


def _api_keys(names: Iterable[int | str]) -> frozenset[int]:
    by_name = {api_name(int(key)).lower(): int(key) for key in ApiKey}
    keys: set[int] = set()
    for entry in names:
        if isinstance(entry, int):
            keys.add(entry)
            continue
        key = by_name.get(entry.replace("_", "").lower())
        if key is None:
            log.warning("tracing.api_keys: %r is not a Kafka API name; ignored", entry)
        else:
            keys.add(key)
    return frozenset(keys)


@dataclass(slots=True)
class TraceConfig:
    exporter: str  # "otlp", "console" or "none"
    otlp_endpoint: str | None = None


class Tracer:
    """kipside's spans. `enabled_for(api_key)` is the only call on the untraced hot path."""

    def __init__(
        self,
        config: TraceConfig,
        rules: Tracing,
        *,
        exporter: SpanExporter | None = None,
        provider: TracerProvider | None = None,
    ) -> None:
        self.api_keys = _api_keys(rules.api_keys)
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if not rules.enabled:
            return
        if exporter is None and provider is None:
            exporter = _exporter(config)
        if exporter is None and provider is None:
            return
        if provider is None:
            # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over the default name.
            defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "kipside"}
            provider = TracerProvider(resource=Resource.create(defaults))
            processor: SpanProcessor
            if isinstance(exporter, ConsoleSpanExporter):
                processor = SimpleSpanProcessor(exporter)
            else:
                assert exporter is not None
                processor = BatchSpanProcessor(exporter)
            provider.add_span_processor(processor)
        self._provider = provider
        self._tracer = provider.get_tracer("kipside")

    @property
    def active(self) -> bool:
        return self._tracer is not None

    def enabled_for(self, api_key: int) -> bool:
        return self._tracer is not None and api_key in self.api_keys

    def request_span(
        self,
        api_key: int,
        api_version: int,
        client_id: str | None,
        peer: str,
        topics: Iterable[str] = (),
        correlation_id: int | None = None,
    ) -> Span:
        assert self._tracer is not None
        operation, operation_type = _OPERATIONS.get(api_key, (api_name(api_key).lower(), "other"))
        topic_list = sorted(set(topics))
        attributes: dict[str, str | int | list[str]] = {
            "messaging.system": "kafka",
            "messaging.operation.name": operation,
            "messaging.operation.type": operation_type,
            "messaging.client.id": client_id or "",
            "kafka.api_key": api_key,
            "kafka.api_name": api_name(api_key),
            "kafka.api_version": api_version,
            "client.address": peer,
        }
        if correlation_id is not None:
            attributes["kafka.correlation_id"] = correlation_id
        if topic_list:
            attributes["messaging.destination.name"] = (
                topic_list[0] if len(topic_list) == 1 else ",".join(topic_list)
            )
            attributes["kafka.topics"] = topic_list
        name = f"{operation} {topic_list[0]}" if len(topic_list) == 1 else api_name(api_key)
        return self._tracer.start_span(name, kind=SpanKind.SERVER, attributes=attributes)

    def upstream_span(
        self,
        api_key: int,
        node_id: int,
        lane: int,
        links: Iterable[Span],
        attributes: dict[str, int],
    ) -> Span:
        assert self._tracer is not None
        span_links = [Link(span.get_span_context()) for span in links]
        return self._tracer.start_span(
            f"upstream {api_name(api_key)}",
            kind=SpanKind.CLIENT,
            links=span_links,
            attributes={
                "messaging.system": "kafka",
                "kafka.api_name": api_name(api_key),
                "kafka.node_id": node_id,
                "kafka.lane": lane,
                **attributes,
            },
        )

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def finish(span: Span | None, error_name: str | None = None) -> None:
    """End a request span, marking it failed with the Kafka error name if there was one."""
    if span is None:
        return
    if error_name:
        span.set_attribute("error.type", error_name)
        span.set_status(Status(StatusCode.ERROR, error_name))
    span.end()


def event(span: Span | None, name: str, **attributes: str | int | float) -> None:
    if span is not None:
        span.add_event(name, attributes)


# The attributes a console line shows, in this order, under short labels; the rest (the
# messaging.* duplicates, the topic list) stays in OTLP.
_LINE_ATTRIBUTES: Final = (
    ("messaging.client.id", "client"),
    ("client.address", "from"),
    ("kafka.correlation_id", "correlation"),
    ("kafka.node_id", "node"),
    ("kafka.lane", "lane"),
    ("kafka.client_request_count", "requests"),
    ("kafka.batch_count", "batches"),
    ("kafka.partition_count", "partitions"),
    ("kafka.request_bytes", "bytes"),
    ("kafka.acks", "acks"),
)


def span_line(span: ReadableSpan) -> str:
    """One span as one console line: end time, name, API and version, duration, key
    attributes, links, events, and the result (`ok` or the Kafka error name)."""
    attrs = span.attributes or {}
    parts = []
    if span.end_time is not None:
        parts.append(datetime.fromtimestamp(span.end_time / 1e9).strftime("%H:%M:%S.%f")[:-3])
    parts.append(span.name)
    if span.kind == SpanKind.SERVER and "kafka.api_name" in attrs:
        api = str(attrs["kafka.api_name"])
        version = f"v{attrs.get('kafka.api_version', '?')!s}"
        parts.append(version if api == span.name else f"{api} {version}")
    if span.end_time is not None and span.start_time is not None:
        parts.append(f"{(span.end_time - span.start_time) / 1e6:.2f}ms")
    shown = ((label, attrs.get(key, "")) for key, label in _LINE_ATTRIBUTES)
    parts.extend(f"{label}={value!s}" for label, value in shown if value != "")
    if span.links:
        parts.append(f"links={len(span.links)}")
    for event in span.events:
        details = " ".join(f"{k}={v!s}" for k, v in (event.attributes or {}).items())
        name = event.name.removeprefix("kipside.txn.")
        parts.append(f"[{name} {details}]" if details else f"[{name}]")
    failed = span.status.status_code == StatusCode.ERROR
    parts.append(str(attrs.get("error.type", span.status.description)) if failed else "ok")
    return " ".join(parts) + "\n"


def _exporter(config: TraceConfig) -> SpanExporter | None:
    if config.exporter == "console":
        # sys.stdout as it is now: `kipside dev` may have put its live console there.
        return ConsoleSpanExporter(out=sys.stdout, formatter=span_line)
    if config.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = config.otlp_endpoint
        if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        # Bounded, so an unreachable collector can't hold up shutdown for long.
        timeout = float(os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT", OTLP_TIMEOUT_SECONDS))
        return OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    return None
