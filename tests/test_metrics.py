"""Tests for proxy.telemetry.metrics and metric_readers: Stats through the OpenTelemetry SDK.

The same counters reach /metrics (Prometheus text, read back with prometheus_client's parser)
and an OTLP/HTTP collector: a loopback HTTP server in a thread that keeps every request body,
decoded with the OTLP protobuf classes. Nothing here goes beyond loopback.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib.metadata import version

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric as OtlpMetric
from prometheus_client.parser import text_string_to_metric_families
from testkit.metrics import parse

from kipside.protocol import ApiKey
from kipside.proxy.telemetry.metric_readers import otlp_metrics_endpoint
from kipside.proxy.telemetry.metrics import Metrics
from kipside.proxy.telemetry.stats import LATENCY_BUCKETS, Stats

OTLP_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_METRICS_EXPORTER",
    "OTEL_SERVICE_NAME",
)


@pytest.fixture(autouse=True)
def no_otlp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTLP_ENV:
        monkeypatch.delenv(name, raising=False)


def busy_stats() -> Stats:
    stats = Stats()
    stats.client_requests[ApiKey.PRODUCE] = 90
    stats.upstream_requests[ApiKey.PRODUCE] = 30
    stats.client_requests[ApiKey.METADATA] = 2
    stats.client_request_bytes[ApiKey.PRODUCE] = 9000
    stats.client_response_bytes[ApiKey.PRODUCE] = 900
    stats.client_connections = 3
    stats.holds = 4
    for seconds in (0.0004, 0.003, 0.003, 2.0):
        stats.observe_latency(ApiKey.PRODUCE, seconds)
    stats.hold_seconds.observe(0.2)
    return stats


def test_prometheus_text_has_kipsides_names_and_values() -> None:
    stats = busy_stats()
    metrics = parse(Metrics(stats).prometheus_text().decode())
    assert metrics.value("kipside_build_info", version=version("kipside")) == 1
    assert metrics.value("kipside_client_requests_total", api="Produce") == 90
    assert metrics.value("kipside_upstream_requests_total", api="Produce") == 30
    assert metrics.value("kipside_bytes_total", api="Produce", direction="request") == 9000
    assert metrics.value("kipside_bytes_total", api="Produce", direction="response") == 900
    assert metrics.value("kipside_coalescing_ratio") == 3.0
    assert metrics.value("kipside_round_trips_saved_total") == 60
    assert metrics.value("kipside_client_connections") == 3
    assert metrics.value("kipside_holds_total") == 4
    latency = "kipside_request_latency_seconds"
    assert metrics.value(f"{latency}_count", api="Produce") == 4
    assert metrics.value(f"{latency}_sum", api="Produce") == pytest.approx(2.0064)
    assert metrics.value(f"{latency}_bucket", api="Produce", le="0.0005") == 1
    assert metrics.value(f"{latency}_bucket", api="Produce", le="0.005") == 3
    assert metrics.value(f"{latency}_bucket", api="Produce", le="+Inf") == 4
    assert metrics.value("kipside_hold_duration_seconds_count") == 1
    # Nothing but kipside's own families: no target_info, no otel_scope_* labels.
    assert all(s.name.startswith("kipside_") for s in metrics.samples)
    assert not any(k.startswith("otel_") for s in metrics.samples for k in s.labels)


def test_counting_after_a_scrape_shows_in_the_next() -> None:
    stats = Stats()
    metrics = Metrics(stats)
    assert parse(metrics.prometheus_text().decode()).value("kipside_lane_failures_total") == 0
    stats.lane_failures += 2
    stats.observe_latency(ApiKey.FETCH, 0.01)
    again = parse(metrics.prometheus_text().decode())
    assert again.value("kipside_lane_failures_total") == 2
    assert again.value("kipside_request_latency_seconds_count", api="Fetch") == 1


def test_two_servers_in_one_process_keep_their_own_metrics() -> None:
    first, second = Stats(), Stats()
    first.holds, second.holds = 1, 7
    one, two = Metrics(first), Metrics(second)
    assert parse(one.prometheus_text().decode()).value("kipside_holds_total") == 1
    assert parse(two.prometheus_text().decode()).value("kipside_holds_total") == 7


# --------------------------------------------------------------------------- OTLP


@pytest.mark.parametrize(
    ("environment", "flag", "expected"),
    [
        ({}, None, None),
        ({}, "http://collector:4318", "http://collector:4318/v1/metrics"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, None, "http://c:4318/v1/metrics"),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9/x"}, "http://t:1", "http://m:9/x"),
        ({"OTEL_METRICS_EXPORTER": "none"}, "http://collector:4318", None),
    ],
    ids=["nothing", "flag", "generic-env", "metrics-env-wins", "exporter-none"],
)
def test_otlp_metrics_endpoint(
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    flag: str | None,
    expected: str | None,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert otlp_metrics_endpoint(flag) == expected


class Collector:
    """An OTLP/HTTP metrics endpoint on loopback that keeps what it is sent."""

    def __init__(self) -> None:
        received: list[tuple[str, bytes]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                received.append((self.path, body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def metrics(self) -> dict[str, OtlpMetric]:
        found: dict[str, OtlpMetric] = {}
        for path, body in self.received:
            assert path == "/v1/metrics"
            request = ExportMetricsServiceRequest.FromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    found |= {metric.name: metric for metric in scope.metrics}
        return found

    def service_names(self) -> set[str]:
        names = set()
        for _, body in self.received:
            for resource in ExportMetricsServiceRequest.FromString(body).resource_metrics:
                attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
                names.add(attributes.get("service.name", ""))
        return names


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.http.shutdown()
    found.http.server_close()


def test_the_same_metrics_go_over_otlp_when_an_endpoint_is_set(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    stats = busy_stats()
    metrics = Metrics(stats, otlp_endpoint=otlp_metrics_endpoint(None))
    prometheus = metrics.prometheus_text().decode()
    metrics.shutdown()  # the OTLP reader exports once more before it stops

    otlp = collector.metrics()
    assert collector.service_names() == {"kipside"}
    exposed = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(prometheus)
    }
    assert set(otlp) == exposed  # one name per metric, whichever way it leaves
    produce = [
        point
        for point in otlp["kipside_client_requests_total"].sum.data_points
        if {a.key: a.value.string_value for a in point.attributes} == {"api": "Produce"}
    ]
    assert [point.as_int for point in produce] == [90]
    assert otlp["kipside_client_requests_total"].sum.is_monotonic
    (latency,) = otlp["kipside_request_latency_seconds"].histogram.data_points
    assert list(latency.explicit_bounds) == list(LATENCY_BUCKETS)
    assert list(latency.bucket_counts) == stats.request_latency[ApiKey.PRODUCE].counts
    assert (latency.count, latency.sum) == (4, pytest.approx(2.0064))
    assert otlp["kipside_request_latency_seconds"].unit == "s"
    assert otlp["kipside_client_connections"].gauge.data_points[0].as_int == 3
