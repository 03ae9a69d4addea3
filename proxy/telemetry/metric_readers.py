"""How kipside's metrics leave the process: a Prometheus registry for GET /metrics, and OTLP.

Both readers add Stats' histograms to what the SDK collected from kipside's observable
instruments (proxy.telemetry.metrics): the SDK has no observable histogram, and recording every
request into an SDK Histogram would cost the request path several times what Stats' own
bucket increment does, so the buckets stay in Stats and become OpenTelemetry histogram data
points at collection time (a "metric producer" in the OpenTelemetry specification's words).

The Prometheus reader has a registry of its own (one per server: servers in one process never
clash), no target_info and no otel_scope_* labels, so /metrics keeps kipside's names and
labels. The OTLP reader collects and exports in the SDK's own thread every
OTEL_METRIC_EXPORT_INTERVAL ms (60 s by default). Nothing here runs per request.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Final

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest

from kipside.protocol import api_name
from kipside.proxy.telemetry.stats import Histogram, Stats

OTLP_TIMEOUT_SECONDS: Final = 2.0
PROMETHEUS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""What prometheus_client.generate_latest writes."""


def _histogram(
    name: str, help_text: str, points: Sequence[tuple[dict[str, str], Histogram]], start_ns: int
) -> Metric:
    now_ns = time.time_ns()
    data_points = []
    for attributes, histogram in points:
        counts = list(histogram.counts)  # one C-level copy, consistent in any thread
        data_points.append(
            HistogramDataPoint(
                attributes=attributes,
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=sum(counts),
                sum=histogram.total,
                bucket_counts=counts,
                explicit_bounds=histogram.buckets,
                # Not recorded, as the SDK's own histograms with record_min_max=False.
                min=math.inf,
                max=-math.inf,
            )
        )
    data = HistogramData(data_points, AggregationTemporality.CUMULATIVE)
    return Metric(name=name, description=help_text, unit="s", data=data)


class StatsHistograms:
    """Adds Stats' histograms to a collection of the SDK's instruments."""

    def __init__(self, stats: Stats, scope: InstrumentationScope) -> None:
        self.stats = stats
        self.scope = scope
        self.start_ns = time.time_ns()

    def metrics(self) -> list[Metric]:
        stats = self.stats
        latency = [
            ({"api": api_name(k)}, h) for k, h in sorted(dict(stats.request_latency).items())
        ]
        found = [
            _histogram(
                "kipside_hold_duration_seconds",
                "How long transaction-begin holds took.",
                [({}, stats.hold_seconds)],
                self.start_ns,
            )
        ]
        if latency:
            help_text = "From a client request read to its response written."
            found.insert(
                0, _histogram("kipside_request_latency_seconds", help_text, latency, self.start_ns)
            )
        return found

    def add_to(self, data: MetricsData) -> MetricsData:
        """`data` with these histograms in kipside's scope (the SDK gives one resource)."""
        if not data.resource_metrics:
            return data
        first, *rest = data.resource_metrics
        scopes = list(first.scope_metrics)
        ours = next((i for i, s in enumerate(scopes) if s.scope == self.scope), None)
        if ours is None:
            scopes.append(ScopeMetrics(self.scope, self.metrics(), self.scope.schema_url or ""))
        else:
            found = scopes[ours]
            scopes[ours] = ScopeMetrics(
                found.scope, [*found.metrics, *self.metrics()], found.schema_url
            )
        merged = ResourceMetrics(first.resource, scopes, first.schema_url)
        return MetricsData([merged, *rest])


class PrometheusReader(PrometheusMetricReader):
    """The reader behind GET /metrics: collects when asked for `text()`."""

    def __init__(self, histograms: StatsHistograms) -> None:
        self.histograms = histograms
        self.registry = CollectorRegistry(auto_describe=False)
        # No target_info and no otel_scope_* labels: /metrics keeps the names and labels
        # kipside has always exposed.
        super().__init__(disable_target_info=True, scope_info_enabled=False, registry=self.registry)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> None:
        super()._receive_metrics(self.histograms.add_to(metrics_data), timeout_millis, **kwargs)

    def text(self) -> bytes:
        """Every metric now, in Prometheus text format 0.0.4 (PROMETHEUS_CONTENT_TYPE)."""
        return generate_latest(self.registry)


class OtlpReader(PeriodicExportingMetricReader):
    """Collects and exports every OTEL_METRIC_EXPORT_INTERVAL ms, in the SDK's thread."""

    def __init__(self, exporter: MetricExporter, histograms: StatsHistograms) -> None:
        self.histograms = histograms  # before the SDK's thread can collect
        super().__init__(exporter)  # interval: OTEL_METRIC_EXPORT_INTERVAL (default 60 s)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> None:
        super()._receive_metrics(self.histograms.add_to(metrics_data), timeout_millis, **kwargs)


def otlp_metrics_endpoint(otlp_endpoint: str | None) -> str | None:
    """Where OTLP metrics go, or None for nowhere.

    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT as given (a full URL); else `otlp_endpoint` (kipside's
    --otlp-endpoint) or OTEL_EXPORTER_OTLP_ENDPOINT with /v1/metrics appended. None when no
    endpoint is set or OTEL_METRICS_EXPORTER is `none`.
    """
    if os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none":
        return None
    explicit = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if explicit:
        return explicit
    base = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not base:
        return None
    base = base.rstrip("/")
    return base if base.endswith("/v1/metrics") else base + "/v1/metrics"


def otlp_exporter(endpoint: str) -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    # Bounded unless the standard variables say otherwise, so an unreachable collector can't
    # hold up shutdown for long.
    configured = {"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"} & set(
        os.environ
    )
    return OTLPMetricExporter(
        endpoint=endpoint, timeout=None if configured else OTLP_TIMEOUT_SECONDS
    )
