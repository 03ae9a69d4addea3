"""Prometheus text exposition of kipside's Stats.

Pure rendering: reads counters, writes text. Every metric has HELP and TYPE lines; names follow
Prometheus conventions (`_total` counters, `_seconds` histograms, `_bytes_total`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kipside.protocol.apis import ApiKey, api_name
from kipside.proxy.telemetry.stats import Histogram, Stats

BUILD_VERSION = "0.1.0"


def _family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def _histogram(name: str, labels: str, histogram: Histogram) -> list[str]:
    sep = "," if labels else ""
    lines = [
        f'{name}_bucket{{{labels}{sep}le="{le}"}} {count}' for le, count in histogram.cumulative()
    ]
    suffix = f"{{{labels}}}" if labels else ""
    lines.append(f"{name}_sum{suffix} {histogram.total:.6f}")
    lines.append(f"{name}_count{suffix} {histogram.count}")
    return lines


def render_metrics(stats: Stats, extra: Iterable[str] = ()) -> str:
    by_api = sorted(stats.client_requests)
    lines = _family(
        "kipside_build_info",
        "gauge",
        "kipside build information.",
        [f'kipside_build_info{{version="{BUILD_VERSION}"}} 1'],
    )
    lines += _family(
        "kipside_client_requests_total",
        "counter",
        "Requests received from clients.",
        [
            f'kipside_client_requests_total{{api="{api_name(k)}"}} {v}'
            for k, v in sorted(stats.client_requests.items())
        ],
    )
    lines += _family(
        "kipside_upstream_requests_total",
        "counter",
        "Requests sent to brokers (a coalesced ProduceRequest counts once).",
        [
            f'kipside_upstream_requests_total{{api="{api_name(k)}"}} {v}'
            for k, v in sorted(stats.upstream_requests.items())
        ],
    )
    lines += _family(
        "kipside_bytes_total",
        "counter",
        "Kafka frame bytes to and from clients, by api.",
        [
            f'kipside_bytes_total{{api="{api_name(k)}",direction="{direction}"}} {counter[k]}'
            for k in by_api
            for direction, counter in (
                ("request", stats.client_request_bytes),
                ("response", stats.client_response_bytes),
            )
        ],
    )
    latency: list[str] = []
    for key in sorted(stats.request_latency):
        latency += _histogram(
            "kipside_request_latency_seconds", f'api="{api_name(key)}"', stats.request_latency[key]
        )
    lines += _family(
        "kipside_request_latency_seconds",
        "histogram",
        "From a client request read to its response written.",
        latency,
    )
    lines += _family(
        "kipside_client_connections",
        "gauge",
        "Open client connections.",
        [f"kipside_client_connections {stats.client_connections}"],
    )
    lines += _family(
        "kipside_upstream_connections",
        "gauge",
        "Open broker connections.",
        [f"kipside_upstream_connections {stats.upstream_connections}"],
    )
    lines += _family(
        "kipside_lane_failures_total",
        "counter",
        "Shared broker connections that ended.",
        [f"kipside_lane_failures_total {stats.lane_failures}"],
    )
    lines += _family(
        "kipside_coalesced_batches_total",
        "counter",
        "Partition batches sent inside coalesced ProduceRequests.",
        [f"kipside_coalesced_batches_total {stats.coalesced_batches}"],
    )
    client_produce = stats.client_requests[ApiKey.PRODUCE]
    upstream_produce = stats.upstream_requests[ApiKey.PRODUCE]
    ratio = client_produce / upstream_produce if upstream_produce else 0.0
    lines += _family(
        "kipside_coalescing_ratio",
        "gauge",
        "Client ProduceRequests per upstream ProduceRequest since start.",
        [f"kipside_coalescing_ratio {ratio:.4f}"],
    )
    lines += _family(
        "kipside_round_trips_saved_total",
        "counter",
        "Broker round trips clients did not cost: coalesced Produce plus locally answered "
        "transaction calls.",
        [f"kipside_round_trips_saved_total {stats.round_trips_saved()}"],
    )
    lines += _family(
        "kipside_txn_local_answers_total",
        "counter",
        "AddPartitionsToTxn/AddOffsetsToTxn answered without a broker round trip.",
        [f"kipside_txn_local_answers_total {stats.txn_local_answers}"],
    )
    lines += _family(
        "kipside_txn_preregistrations_total",
        "counter",
        "Transactions whose declared outputs and group kipside registered up front.",
        [f"kipside_txn_preregistrations_total {stats.txn_preregistrations}"],
    )
    lines += _family(
        "kipside_holds_total",
        "counter",
        "Transaction-begin holds (a registration that met CONCURRENT_TRANSACTIONS).",
        [f"kipside_holds_total {stats.holds}"],
    )
    lines += _family(
        "kipside_hold_retries_total",
        "counter",
        "Upstream retries made while holding.",
        [f"kipside_hold_retries_total {stats.hold_retries}"],
    )
    lines += _family(
        "kipside_hold_duration_seconds",
        "histogram",
        "How long transaction-begin holds took.",
        _histogram("kipside_hold_duration_seconds", "", stats.hold_seconds),
    )
    lines += _family(
        "kipside_rule_problems_total",
        "counter",
        "Declared transaction outputs the broker refused or doesn't know.",
        [f"kipside_rule_problems_total {stats.rule_problems}"],
    )
    lines += list(extra)
    return "\n".join(lines) + "\n"
