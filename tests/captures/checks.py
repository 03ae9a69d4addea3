"""What a summary of a captured run must show, checked against counts nobody derived from it:
the relay's (broker side), kipside's own (client side) and tshark's Kafka dissector (Wireshark's,
written by nobody here).

tshark 4.0 dissects Produce up to v8; librdkafka writes v9+ and kipside's coalesced requests
use the broker's highest version, which tshark reports as malformed after the first topic. So
partitions are compared for the versions tshark reads (READABLE_PRODUCE), against the summary's
`partitions_by_version`; requests are compared for every API and version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from testkit.capture import tshark_fields

from kipside.evidence import Summary
from kipside.protocol import api_name

from .scenarios import Run

READABLE_PRODUCE = range(0, 9)


@dataclass(frozen=True)
class TsharkView:
    requests: Counter[str]
    """Requests per API (Kafka's names)."""
    readable_produce_partitions: int
    """Partitions in Produce requests of the versions tshark reads."""


def tshark_view(path: Path, server_ports: Iterable[int]) -> TsharkView:
    ports = sorted(set(server_ports))
    to_server = " || ".join(f"tcp.dstport == {p}" for p in ports)
    rows = tshark_fields(
        path,
        ports,
        ["kafka.api_key", "kafka.api_version", "kafka.partition_id"],
        display_filter=f"({to_server}) && kafka.api_key",
    )
    requests: Counter[str] = Counter()
    partitions = 0
    for row in rows:
        keys, versions, partition_ids = [*row, "", ""][:3]
        api_keys = [int(k) for k in keys.split(",") if k]
        requests.update(api_name(k) for k in api_keys)
        produce_versions = {
            int(v) for k, v in zip(api_keys, versions.split(","), strict=False) if k == 0
        }
        if partition_ids and produce_versions and produce_versions <= set(READABLE_PRODUCE):
            partitions += len(partition_ids.split(","))
    return TsharkView(requests, partitions)


def readable_partitions(partitions_by_version: dict[str, int]) -> int:
    """The summary's Produce partitions in the versions tshark reads."""
    return sum(n for v, n in partitions_by_version.items() if int(v[1:]) in READABLE_PRODUCE)


# Repeated or reordered segments (loopback's tail-loss probes retransmit) lose nothing, and
# neither does a request the client closed its connection on before the answer came (a client
# that closes waits for no answer: librdkafka's coordinator queries on shutdown).
HARMLESS = frozenset({"retransmitted", "overlapping", "out_of_order", "abandoned"})


def assert_nothing_lost(summary: Summary) -> None:
    lost = {k: n for k, n in summary.skipped.items() if n and k not in HARMLESS}
    assert lost == {}, f"{summary.file}: {lost}"


def requests(summary: Summary) -> dict[str, int]:
    return {name: api.requests for name, api in summary.apis.items()}


def assert_broker_side(summary: Summary, run: Run) -> None:
    """The summary of a broker-side capture equals the relay's counts of the same run."""
    relay = run.relay
    assert requests(summary) == relay["requests"]
    assert sum(summary.connections.values()) == relay["connections"]
    assert_nothing_lost(summary)
    if run.scenario == "coalescing":
        assert summary.produce.batches == relay["produce_batches"]
        assert summary.produce.partitions == relay["produce_batches"]  # one batch a partition
        assert summary.produce.records == relay["produce_records"]
        assert summary.produce.acks0 == relay["acks0_requests"]
    else:
        assert relay["failed_end_txn"] == 0  # the relay counts no failed EndTxn in a transaction
        t = summary.transactions
        assert t.ended == relay["transactions_ended"]
        assert t.committed == relay["committed"]
        assert t.round_trips == relay["coordinator_round_trips"]
        assert (t.open, t.open_round_trips) == (0, 0)
        concurrent = {api: n for api, n in relay["concurrent_transactions"].items() if n}
        assert summary.concurrent_transactions == concurrent


def assert_client_side(client: Summary, broker: Summary, run: Run) -> None:
    """The summary of a client-side capture equals kipside's count of its clients' requests,
    and its Produce batches are the broker side's."""
    assert requests(client) == run.kipside["client_requests"]
    assert_nothing_lost(client)
    produce, upstream = client.produce, broker.produce
    assert (produce.batches, produce.records, produce.batch_bytes) == (
        upstream.batches,
        upstream.records,
        upstream.batch_bytes,
    )
    if run.scenario == "transactions":
        assert client.transactions.committed == run.kipside["committed_by_client"]
        assert client.concurrent_transactions == {}  # kipside held the client through them


def assert_tshark_agrees(path: Path, summary: Summary, run: Run, side: str) -> None:
    ports = run.kipside_ports if side == "client" else [run.broker_port]
    view = tshark_view(path, ports)
    assert dict(view.requests) == requests(summary)
    partitions = readable_partitions(summary.produce.partitions_by_version)
    assert view.readable_produce_partitions == partitions
    if run.scenario == "coalescing" and side == "client":
        assert partitions > summary.api("Produce").versions.get("v7", 0) > 0  # aiokafka's
