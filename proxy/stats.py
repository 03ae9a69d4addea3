"""Counters kipside keeps about its own traffic, read by the admin endpoint and the tests.

Plain integers updated on the hot path (no locks: trio runs one task at a time). Exported in
Prometheus text format by proxy.admin. Must never do I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Stats:
    client_requests: Counter[int] = field(default_factory=Counter)
    """Requests received from clients, by api key."""
    upstream_requests: Counter[int] = field(default_factory=Counter)
    """Requests sent to brokers, by api key (a coalesced ProduceRequest counts once)."""
    coalesced_batches: int = 0
    """Partition batches sent upstream inside coalesced ProduceRequests."""
    client_connections: int = 0
    upstream_connections: int = 0
    lane_failures: int = 0
