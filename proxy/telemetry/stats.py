"""Counters and histograms kipside keeps about its own traffic, for metrics and the tests.

Plain numbers updated on the hot path (no locks: trio runs one task at a time): an add, or a
bisect into fixed buckets, per event. proxy.telemetry.metrics reads them only when a metrics
reader collects (/metrics, OTLP), so counting costs no more than this. Must never do I/O.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from kipside.protocol import ApiKey

# Seconds; fine at the low end, where a proxy's added latency lives.
LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


@dataclass(slots=True)
class Stats:
    client_requests: Counter[int] = field(default_factory=Counter)
    """Requests received from clients, by api key."""
    client_request_bytes: Counter[int] = field(default_factory=Counter)
    client_response_bytes: Counter[int] = field(default_factory=Counter)
    upstream_requests: Counter[int] = field(default_factory=Counter)
    """Requests sent to brokers, by api key (a coalesced ProduceRequest counts once)."""
    request_latency: dict[int, Histogram] = field(default_factory=dict)
    """Client request to response written, by api key."""
    coalesced_batches: int = 0
    """Partition batches sent upstream inside coalesced ProduceRequests."""
    produce_route_waits: int = 0
    """ProduceRequests that waited for the same client's earlier batches of their partitions on
    another route (the lanes or its own broker connection) before going
    (stages.coalescing.order)."""
    client_connections: int = 0
    upstream_connections: int = 0
    lane_failures: int = 0
    txn_local_answers: int = 0
    """AddPartitionsToTxn/AddOffsetsToTxn answered by kipside without a round trip."""
    txn_preregistrations: int = 0
    """Upstream AddPartitionsToTxn/AddOffsetsToTxn kipside sent for a client's first add."""
    holds: int = 0
    hold_retries: int = 0
    hold_seconds: Histogram = field(default_factory=Histogram)
    rule_problems: int = 0
    limit_reached: Counter[str] = field(default_factory=Counter)
    """Times a limit of the rule file's ``limits`` section was reached, by key."""
    in_flight_bytes: int = 0
    """Bytes kipside holds for clients now: requests read and not yet answered, and answers
    their sockets have not taken yet (core.limits)."""
    paused_client_connections: int = 0
    """Client connections whose requests kipside is not reading now (an in-flight limit)."""

    def observe_latency(self, api_key: int, seconds: float) -> None:
        histogram = self.request_latency.get(api_key)
        if histogram is None:
            histogram = self.request_latency[api_key] = Histogram()
        histogram.observe(seconds)

    def round_trips_saved(self) -> int:
        """Broker round trips clients would have cost without kipside: coalesced Produce
        requests plus locally answered transaction calls."""
        produce = self.client_requests[ApiKey.PRODUCE] - self.upstream_requests[ApiKey.PRODUCE]
        return max(produce, 0) + self.txn_local_answers
