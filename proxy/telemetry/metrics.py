"""kipside's Stats as OpenTelemetry metrics: what is measured, under which names.

The request path keeps counting in Stats (plain ints, Counters and bucket lists: one add or one
bisect per event, as before the SDK). The OpenTelemetry metrics SDK reads them only when a
reader collects: each counter and gauge here is an observable instrument whose callback reads
Stats; the two latency histograms are added from Stats' own buckets by the readers
(proxy.telemetry.metric_readers). bench/counting_cost.py measures why: an SDK Counter.add or
Histogram.record per request would cost several times the counting itself.

Names are the Prometheus names dashboards use, and the same over OTLP.
This module must never be called per request, and never blocks trio.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from importlib.metadata import version
from operator import attrgetter
from typing import Final, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kipside.protocol import ApiKey, api_name
from kipside.proxy.telemetry.metric_readers import (
    OtlpReader,
    PrometheusReader,
    StatsHistograms,
    otlp_exporter,
)
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet

KIPSIDE_VERSION: Final = version("kipside")
"""The installed distribution's version (pyproject.toml's, one place)."""

Read = Callable[[Stats], int | float]

_COUNTERS: Final[tuple[tuple[str, str, Read], ...]] = (
    (
        "kipside_lane_failures_total",
        "Shared broker connections that ended.",
        attrgetter("lane_failures"),
    ),
    (
        "kipside_coalesced_batches_total",
        "Partition batches sent inside coalesced ProduceRequests.",
        attrgetter("coalesced_batches"),
    ),
    (
        "kipside_round_trips_saved_total",
        "Broker round trips clients did not cost: coalesced Produce plus locally answered "
        "transaction calls.",
        Stats.round_trips_saved,
    ),
    (
        "kipside_txn_local_answers_total",
        "AddPartitionsToTxn/AddOffsetsToTxn answered without a broker round trip.",
        attrgetter("txn_local_answers"),
    ),
    (
        "kipside_txn_preregistrations_total",
        "Transactions whose declared outputs and group kipside registered up front.",
        attrgetter("txn_preregistrations"),
    ),
    (
        "kipside_holds_total",
        "Transaction-begin holds (a registration that met CONCURRENT_TRANSACTIONS).",
        attrgetter("holds"),
    ),
    (
        "kipside_hold_retries_total",
        "Upstream retries made while holding.",
        attrgetter("hold_retries"),
    ),
    (
        "kipside_rule_problems_total",
        "Declared transaction outputs the broker refused or doesn't know.",
        attrgetter("rule_problems"),
    ),
)


def _coalescing_ratio(stats: Stats) -> float:
    upstream = stats.upstream_requests[ApiKey.PRODUCE]
    return stats.client_requests[ApiKey.PRODUCE] / upstream if upstream else 0.0


_GAUGES: Final[tuple[tuple[str, str, Read], ...]] = (
    ("kipside_client_connections", "Open client connections.", attrgetter("client_connections")),
    (
        "kipside_upstream_connections",
        "Open broker connections.",
        attrgetter("upstream_connections"),
    ),
    (
        "kipside_coalescing_ratio",
        "Client ProduceRequests per upstream ProduceRequest since start.",
        _coalescing_ratio,
    ),
)


class ReloadCounts(Protocol):
    """What the metrics read of the rule reloader (proxy.operations.reload.RuleReloader)."""

    @property
    def rule_reloads(self) -> int: ...
    @property
    def rule_reload_errors(self) -> int: ...


Callback = Callable[[CallbackOptions], Iterable[Observation]]


def _one(read: Callable[[], float]) -> Callback:
    return lambda _options: [Observation(read())]


def _by_api(counter: Callable[[], dict[int, int]]) -> Callback:
    # dict(...) copies in one C call: consistent even while the OTLP reader's thread collects.
    return lambda _options: [
        Observation(v, {"api": api_name(k)}) for k, v in sorted(dict(counter()).items())
    ]


def _frame_bytes(stats: Stats) -> Callback:
    def observe(_options: CallbackOptions) -> list[Observation]:
        sent, received = dict(stats.client_request_bytes), dict(stats.client_response_bytes)
        return [
            Observation(count.get(k, 0), {"api": api_name(k), "direction": direction})
            for k in sorted(sent.keys() | received.keys())
            for direction, count in (("request", sent), ("response", received))
        ]

    return observe


def _observe_stats(meter: Meter, stats: Stats) -> None:
    build = {"version": KIPSIDE_VERSION}
    meter.create_observable_gauge(
        "kipside_build_info", [lambda _o: [Observation(1, build)]], "", "kipside build information."
    )
    for name, help_text, read in _COUNTERS:
        meter.create_observable_counter(name, [_one(partial(read, stats))], "", help_text)
    for name, help_text, read in _GAUGES:
        meter.create_observable_gauge(name, [_one(partial(read, stats))], "", help_text)
    meter.create_observable_counter(
        "kipside_client_requests_total",
        [_by_api(lambda: stats.client_requests)],
        "",
        "Requests received from clients.",
    )
    meter.create_observable_counter(
        "kipside_upstream_requests_total",
        [_by_api(lambda: stats.upstream_requests)],
        "",
        "Requests sent to brokers (a coalesced ProduceRequest counts once).",
    )
    meter.create_observable_counter(
        "kipside_bytes_total",
        [_frame_bytes(stats)],
        "By",
        "Kafka frame bytes to and from clients, by api.",
    )


def _observe_rules(meter: Meter, rules: Callable[[], RuleSet], reloads: ReloadCounts) -> None:
    def info(_options: CallbackOptions) -> list[Observation]:
        ruleset = rules()
        return [Observation(1, {"version": ruleset.version, "source": ruleset.source})]

    meter.create_observable_gauge(
        "kipside_rules_info",
        [info],
        "",
        "The rule set in force (version: first 12 hex digits of the SHA-256 of the file).",
    )
    meter.create_observable_counter(
        "kipside_rule_reloads_total",
        [_one(lambda: reloads.rule_reloads)],
        "",
        "Rule reloads that read a valid file (SIGHUP, file change or POST /rules/reload).",
    )
    meter.create_observable_counter(
        "kipside_rule_reload_errors_total",
        [_one(lambda: reloads.rule_reload_errors)],
        "",
        "Rule reloads rejected because the file was invalid or unreadable; the rules in force "
        "stayed.",
    )


def kipside_resource() -> Resource:
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over the default name.
    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "kipside"}
    return Resource.create(defaults)


class Metrics:
    """The server's metrics: one MeterProvider over its Stats (and its rules, when given)."""

    def __init__(
        self,
        stats: Stats,
        *,
        rules: Callable[[], RuleSet] | None = None,
        reloads: ReloadCounts | None = None,
        otlp_endpoint: str | None = None,
    ) -> None:
        """OTLP export is on when `otlp_endpoint` is set (metric_readers.otlp_metrics_endpoint
        says where from); `rules` and `reloads` add the rule metrics."""
        scope = InstrumentationScope("kipside", KIPSIDE_VERSION)
        histograms = StatsHistograms(stats, scope)
        self.prometheus = PrometheusReader(histograms)
        readers: list[MetricReader] = [self.prometheus]
        if otlp_endpoint:
            readers.append(OtlpReader(otlp_exporter(otlp_endpoint), histograms))
        self._provider = MeterProvider(
            metric_readers=readers, resource=kipside_resource(), shutdown_on_exit=False
        )
        meter = self._provider.get_meter(scope.name, scope.version)
        _observe_stats(meter, stats)
        if rules is not None and reloads is not None:
            _observe_rules(meter, rules, reloads)

    def prometheus_text(self) -> bytes:
        """Every metric now, in Prometheus text format (metric_readers.PROMETHEUS_CONTENT_TYPE)."""
        return self.prometheus.text()

    def shutdown(self) -> None:
        """Stop the readers; the OTLP reader exports one last time first."""
        self._provider.shutdown()
