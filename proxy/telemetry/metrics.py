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
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from importlib.metadata import version
from operator import attrgetter
from typing import Final, NamedTuple, Protocol, TypeAlias, TypeVar

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

S = TypeVar("S")
# What a metric reads when a reader collects: a number, a count per API key (each labelled
# api="Produce", ...), or the observations themselves.
Reading = float | Mapping[int, int] | list[Observation]
# (name, unit, help, read). A name ending in _total is a counter, any other a gauge (the
# OpenMetrics naming rule).
Metric: TypeAlias = tuple[str, str, str, Callable[[S], Reading]]


def _frame_bytes(stats: Stats) -> list[Observation]:
    sent, received = dict(stats.client_request_bytes), dict(stats.client_response_bytes)
    return [
        Observation(count.get(k, 0), {"api": api_name(k), "direction": direction})
        for k in sorted(sent.keys() | received.keys())
        for direction, count in (("request", sent), ("response", received))
    ]


def _coalescing_ratio(stats: Stats) -> float:
    upstream = stats.upstream_requests[ApiKey.PRODUCE]
    return stats.client_requests[ApiKey.PRODUCE] / upstream if upstream else 0.0


def _build_info(_stats: Stats) -> list[Observation]:
    return [Observation(1, {"version": KIPSIDE_VERSION})]


def _columnar_batches(stats: Stats) -> list[Observation]:
    batches = stats.columnar.snapshot().batches
    return [
        Observation(n, {"direction": direction, "outcome": outcome})
        for (direction, outcome), n in sorted(batches.items())
    ]


def _columnar_records(stats: Stats) -> list[Observation]:
    records = stats.columnar.snapshot().records
    return [Observation(n, {"direction": d}) for d, n in sorted(records.items())]


def _columnar_bytes(stats: Stats) -> list[Observation]:
    tally = stats.columnar.snapshot()
    return [
        Observation(n, {"direction": d, "form": form})
        for form, counts in (("ordinary", tally.ordinary_bytes), ("carrier", tally.carrier_bytes))
        for d, n in sorted(counts.items())
    ]


def _columnar_seconds(stats: Stats) -> list[Observation]:
    seconds = stats.columnar.snapshot().seconds
    return [Observation(s, {"direction": d}) for d, s in sorted(seconds.items())]


def _limits_reached(stats: Stats) -> list[Observation]:
    return [Observation(n, {"limit": key}) for key, n in sorted(dict(stats.limit_reached).items())]


# Stats' metrics, in the order /metrics lists them.
_STATS_METRICS: Final[tuple[Metric[Stats], ...]] = (
    ("kipside_build_info", "", "kipside build information.", _build_info),
    (
        "kipside_lane_failures_total",
        "",
        "Shared broker connections that ended.",
        attrgetter("lane_failures"),
    ),
    (
        "kipside_coalesced_batches_total",
        "",
        "Partition batches sent inside coalesced ProduceRequests.",
        attrgetter("coalesced_batches"),
    ),
    (
        "kipside_produce_route_waits_total",
        "",
        "ProduceRequests that waited for the client's earlier batches of their partitions on "
        "another route (the shared lanes or its own broker connection) before going.",
        attrgetter("produce_route_waits"),
    ),
    (
        "kipside_round_trips_saved_total",
        "",
        "Broker round trips clients did not cost: coalesced Produce plus locally answered "
        "transaction calls.",
        Stats.round_trips_saved,
    ),
    (
        "kipside_txn_local_answers_total",
        "",
        "AddPartitionsToTxn/AddOffsetsToTxn answered without a broker round trip.",
        attrgetter("txn_local_answers"),
    ),
    (
        "kipside_txn_preregistrations_total",
        "",
        "Transactions whose declared outputs and group kipside registered up front.",
        attrgetter("txn_preregistrations"),
    ),
    (
        "kipside_holds_total",
        "",
        "Transaction-begin holds (a registration sent later than asked for, to meet the "
        "coordinator ready, or that met CONCURRENT_TRANSACTIONS).",
        attrgetter("holds"),
    ),
    (
        "kipside_hold_retries_total",
        "",
        "Probes of the coordinator made while holding (registrations sent again, or "
        "DescribeTransactions).",
        attrgetter("hold_retries"),
    ),
    (
        "kipside_rule_problems_total",
        "",
        "Declared transaction outputs the broker refused or doesn't know.",
        attrgetter("rule_problems"),
    ),
    (
        "kipside_client_connections",
        "",
        "Open client connections.",
        attrgetter("client_connections"),
    ),
    (
        "kipside_upstream_connections",
        "",
        "Open broker connections.",
        attrgetter("upstream_connections"),
    ),
    (
        "kipside_limit_reached_total",
        "",
        "Times a limit of the rule file's limits section was reached, by its key.",
        _limits_reached,
    ),
    (
        "kipside_in_flight_bytes",
        "By",
        "Bytes held for clients: requests read and not yet answered, answers not yet sent.",
        attrgetter("in_flight_bytes"),
    ),
    (
        "kipside_paused_client_connections",
        "",
        "Client connections whose requests are not read now (an in-flight bytes limit).",
        attrgetter("paused_client_connections"),
    ),
    (
        "kipside_coalescing_ratio",
        "",
        "Client ProduceRequests per upstream ProduceRequest since start.",
        _coalescing_ratio,
    ),
    (
        "kipside_client_requests_total",
        "",
        "Requests received from clients.",
        attrgetter("client_requests"),
    ),
    (
        "kipside_upstream_requests_total",
        "",
        "Requests sent to brokers (a coalesced ProduceRequest counts once).",
        attrgetter("upstream_requests"),
    ),
    ("kipside_bytes_total", "By", "Kafka frame bytes to and from clients, by api.", _frame_bytes),
    (
        "kipside_columnar_batches_total",
        "",
        "Record batches of columnar topics, by direction (produce, fetch) and outcome "
        "(converted; produce: small, misfit, malformed, carrier, refused; fetch: undecodable, "
        "deferred).",
        _columnar_batches,
    ),
    (
        "kipside_columnar_records_total",
        "",
        "Records in the batches converted to carriers (produce) and back (fetch).",
        _columnar_records,
    ),
    (
        "kipside_columnar_bytes_total",
        "By",
        "Bytes of the converted batches as ordinary batches and as carriers, by direction.",
        _columnar_bytes,
    ),
    (
        "kipside_columnar_cpu_seconds_total",
        "s",
        "CPU seconds of the worker threads converting, by direction.",
        _columnar_seconds,
    ),
)


class ReloadCounts(Protocol):
    """What the metrics read of the rule reloader (proxy.operations.reload.RuleReloader)."""

    @property
    def rule_reloads(self) -> int: ...
    @property
    def rule_reload_errors(self) -> int: ...


class _RuleSource(NamedTuple):
    rules: Callable[[], RuleSet]
    reloads: ReloadCounts


def _rules_info(source: _RuleSource) -> list[Observation]:
    ruleset = source.rules()
    return [Observation(1, {"version": ruleset.version, "source": ruleset.source})]


_RULE_METRICS: Final[tuple[Metric[_RuleSource], ...]] = (
    (
        "kipside_rules_info",
        "",
        "The rule set in force (version: first 12 hex digits of the SHA-256 of the file).",
        _rules_info,
    ),
    (
        "kipside_rule_reloads_total",
        "",
        "Rule reloads that read a valid file (SIGHUP, file change or POST /rules/reload).",
        attrgetter("reloads.rule_reloads"),
    ),
    (
        "kipside_rule_reload_errors_total",
        "",
        "Rule reloads rejected because the file was invalid or unreadable; the rules in force "
        "stayed.",
        attrgetter("reloads.rule_reload_errors"),
    ),
)


def _observations(
    read: Callable[[S], Reading], source: S, _options: CallbackOptions
) -> list[Observation]:
    value = read(source)
    if isinstance(value, list):
        return value
    if isinstance(value, Mapping):
        # dict(...) copies in one C call: consistent even while the OTLP reader's thread
        # collects.
        return [Observation(n, {"api": api_name(k)}) for k, n in sorted(dict(value).items())]
    return [Observation(value)]


def _observe(meter: Meter, metrics: Iterable[Metric[S]], source: S) -> None:
    """One observable instrument per metric, reading `source` when a reader collects."""
    for name, unit, help_text, read in metrics:
        callbacks = [partial(_observations, read, source)]
        if name.endswith("_total"):
            meter.create_observable_counter(name, callbacks, unit, help_text)
        else:
            meter.create_observable_gauge(name, callbacks, unit, help_text)


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
        _observe(meter, _STATS_METRICS, stats)
        if rules is not None and reloads is not None:
            _observe(meter, _RULE_METRICS, _RuleSource(rules, reloads))

    def prometheus_text(self) -> bytes:
        """Every metric now, in Prometheus text format (metric_readers.PROMETHEUS_CONTENT_TYPE)."""
        return self.prometheus.text()

    def shutdown(self) -> None:
        """Stop the readers; the OTLP reader exports one last time first."""
        self._provider.shutdown()
