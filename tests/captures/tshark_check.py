"""tshark's Kafka dissector (Wireshark's, written by nobody here) reading the same captures as
`kipside pcap summary`: requests per API, and the partitions of the Produce requests it can read.

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

from kipside.protocol import api_name

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
