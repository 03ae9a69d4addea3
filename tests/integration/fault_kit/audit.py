"""The audit: the log, read from the broker itself, against what the clients were told."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import confluent_kafka as ck

from ..txn_log import read_log, resolve
from .loads import SequencedProducer, parse_value


@dataclass
class Audit:
    """The log against what clients were told. `found` counts acknowledged messages in the
    log (each once); duplicates are extra copies of any message; reordered are records whose
    sequence is not above the previous one of the same producer and partition. Producers
    named in `at_least_once` (no idempotence) may write duplicates: theirs are counted apart
    (`resent`), and only their first copies are checked for order."""

    acknowledged: int
    found: int
    duplicates: int
    reordered: int
    lost: list[bytes]
    unacknowledged_in_log: int  # failed or never reported, yet written: allowed, counted
    aborted_in_log: int  # records of aborted transactions (read_committed hides them)
    resent: int = 0  # duplicates of at-least-once producers: allowed, counted
    duplicated: list[bytes] = field(default_factory=list)  # the first few duplicated values

    def line(self) -> str:
        text = (
            f"acknowledged {self.acknowledged}, found {self.found}, duplicates "
            f"{self.duplicates}, reordered {self.reordered}"
        )
        return text + (f" (at-least-once duplicates {self.resent})" if self.resent else "")

    @property
    def clean(self) -> bool:
        """Nothing acknowledged lost; no duplicate; order per producer and partition."""
        return (
            not self.lost
            and self.duplicates == 0
            and self.reordered == 0
            and self.found == self.acknowledged
        )

    def assert_clean(self) -> None:
        """Nothing acknowledged lost; no duplicate; order per producer and partition."""
        assert not self.lost, f"{len(self.lost)} acknowledged messages lost: {self.lost[:5]}"
        assert self.duplicates == 0, f"{self.line()}: duplicated {self.duplicated}"
        assert self.reordered == 0, f"{self.reordered} reordered ({self.line()})"
        assert self.found == self.acknowledged, self.line()


def audit(
    direct: str,
    topic: str,
    partitions: int,
    acknowledged: Iterable[bytes],
    at_least_once: Iterable[str] = (),
) -> Audit:
    acked, lenient = set(acknowledged), set(at_least_once)
    aborted = 0
    counts: Counter[bytes] = Counter()
    reordered = 0
    for p in range(partitions):
        resolved = resolve(read_log(direct, topic, p))
        aborted += len(resolved.aborted)
        last: dict[str, int] = {}
        for value in resolved.committed:
            counts[value] += 1
            name, partition, seq = parse_value(value)
            assert partition == p, f"{value!r} is in partition {p}"
            if counts[value] > 1 and name in lenient:
                continue
            if seq <= last.get(name, -1):
                reordered += 1
            last[name] = max(seq, last.get(name, -1))
    extra = {v: n - 1 for v, n in counts.items() if n > 1}
    resent = sum(n for v, n in extra.items() if parse_value(v)[0] in lenient)
    return Audit(
        acknowledged=len(acked),
        found=sum(1 for v in acked if counts[v] >= 1),
        duplicates=sum(extra.values()) - resent,
        reordered=reordered,
        lost=sorted(v for v in acked if counts[v] == 0),
        unacknowledged_in_log=sum(1 for v in counts if v not in acked),
        aborted_in_log=aborted,
        resent=resent,
        duplicated=sorted(v for v in extra if parse_value(v)[0] not in lenient)[:10],
    )


def acked_of(producers: Iterable[SequencedProducer]) -> list[bytes]:
    return [v for p in producers for v in p.delivered.acked]


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def group_offset(direct: str, group: str, topic: str, partition: int = 0) -> int:
    """The group's committed offset, asked of the broker itself (-1001: none)."""
    return committed_offsets(direct, group, topic, partition + 1)[partition]


def committed_offsets(direct: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition, asked of the broker itself."""
    consumer = ck.Consumer({"bootstrap.servers": direct, "group.id": group})
    try:
        tps = [ck.TopicPartition(topic, p) for p in range(partitions)]
        out = {}
        for tp in consumer.committed(tps, timeout=10):
            assert tp.error is None, tp.error
            out[tp.partition] = int(tp.offset)
        return out
    finally:
        consumer.close()
