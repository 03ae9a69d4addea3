"""The driver's side of the `kipside` source: which partitions, and from where to where.

It resolves the subscription to topic-partitions, turns startingOffsets / endingOffsets (and
their timestamp forms) into concrete offsets, and finds each partition's latest offset from the
Fetch watermarks (pipeline.kafka.offsets explains why not ListOffsets). Spark's Kafka source is
the model: a subscribed topic that does not exist is an error, a pattern is matched against
whole topic names (internal topics excluded), offsets given as JSON must name every partition,
and a timestamp with no offset at or after it fails unless startingOffsetsByTimestampStrategy is
latest. It never reads records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import DataLossError, TopicNotFound
from kipside.pipeline.kafka.offsets import EARLIEST, LATEST, Watermarks, list_offsets, watermarks

from .options import OffsetSpec, OptionError, SourceOptions, Subscription
from .ranges import Offsets

__all__ = ["Planner", "skip_lost"]

TopicPartition = tuple[str, int]


class Planner:
    def __init__(self, client: KafkaClient, options: SourceOptions) -> None:
        self.client = client
        self.options = options

    # Partitions --------------------------------------------------------------------------

    def partitions(self) -> list[TopicPartition]:
        """The topic-partitions the subscription names now."""
        sub = self.options.subscription
        meta = self.client.retrying("reading topics", lambda: self.client.metadata(refresh=True))
        topics = {name: t for name, t in meta.topics.items() if t.error_code == 0}
        if sub.kind == "subscribePattern":
            assert sub.pattern is not None
            pattern = re.compile(sub.pattern)
            chosen = [n for n, t in topics.items() if not t.internal and pattern.fullmatch(n)]
            if not chosen:
                raise TopicNotFound(
                    f"option subscribePattern: {sub.pattern!r} matches no topic of "
                    f"{self.client.where} (it must match whole names; topics there: "
                    f"{_sample(n for n, t in topics.items() if not t.internal)})"
                )
            return sorted((n, p) for n in chosen for p in topics[n].partitions)
        if sub.kind == "subscribe":
            missing = [t for t in sub.topics if t not in topics]
            if missing:
                raise TopicNotFound(
                    f"option subscribe: topic {', '.join(missing)} does not exist in "
                    f"{self.client.where} (topics there: {_sample(topics)})"
                )
            return sorted((n, p) for n in sub.topics for p in topics[n].partitions)
        return self._assigned(sub, topics)

    def _assigned(self, sub: Subscription, topics: Mapping[str, object]) -> list[TopicPartition]:
        meta = self.client.metadata()
        for topic, partition in sub.partitions:
            info = meta.topics.get(topic)
            if info is None or topic not in topics:
                raise TopicNotFound(
                    f"option assign: topic {topic!r} does not exist in {self.client.where}"
                )
            if partition not in info.partitions:
                raise TopicNotFound(
                    f"option assign: {topic} has no partition {partition} (it has "
                    f"{len(info.partitions)})"
                )
        return sorted(sub.partitions)

    # Offsets -----------------------------------------------------------------------------

    def watermarks(
        self, probe_at: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, Watermarks]:
        return watermarks(self.client, probe_at)

    def earliest(self, partitions: Iterable[TopicPartition]) -> Offsets:
        wanted = list(partitions)
        if not wanted:
            return {}
        return list_offsets(self.client, {tp: EARLIEST for tp in wanted})

    def latest(
        self, start: Mapping[TopicPartition, int]
    ) -> tuple[Offsets, dict[TopicPartition, Watermarks]]:
        """Each partition's end (LSO under read_committed, else HW), probing at `start`."""
        marks = self.watermarks(start)
        committed = self.options.committed_only
        return {tp: m.end(committed) for tp, m in marks.items()}, marks

    def resolve(
        self, spec: OffsetSpec, partitions: list[TopicPartition], *, starting: bool
    ) -> Offsets:
        """Concrete offsets for `spec` over `partitions`."""
        if spec.kind == "earliest":
            return self.earliest(partitions)
        if spec.kind == "latest":
            return self.latest(self.earliest(partitions))[0]
        if spec.kind == "offsets":
            given = dict(spec.per_partition)
            _check_names_all(spec, given, partitions)
            return self._fill_special(given)
        queries: dict[TopicPartition, int | None] = (
            dict.fromkeys(partitions, spec.timestamp)
            if spec.kind == "timestamp"
            else dict(spec.per_partition)
        )
        if spec.kind == "timestamps":
            _check_names_all(spec, queries, partitions)
        return self._by_timestamp(spec, queries, starting=starting)

    def _fill_special(self, given: dict[TopicPartition, int]) -> Offsets:
        earliest = [tp for tp, o in given.items() if o == EARLIEST]
        latest = [tp for tp, o in given.items() if o == LATEST]
        out = dict(given)
        out.update(self.earliest(earliest))
        if latest:
            out.update(self.latest(self.earliest(latest))[0])
        return out

    def _by_timestamp(
        self, spec: OffsetSpec, queries: dict[TopicPartition, int | None], *, starting: bool
    ) -> Offsets:
        found = list_offsets(self.client, {tp: int(ts or 0) for tp, ts in queries.items()})
        none = [tp for tp, o in found.items() if o < 0]
        if none:
            ends = self.latest(self.earliest(none))[0]
            if starting and not self.options.no_match_latest:
                names = ", ".join(f"{t}-{p}" for t, p in none)
                raise OptionError(
                    f"option {spec.option}: no record at or after the timestamp in {names}. "
                    "Set startingOffsetsByTimestampStrategy=latest to start at the end instead"
                )
            found.update(ends)
        return found


def skip_lost(
    start: Offsets, end: Offsets, log_start: Offsets, *, fail: bool, where: str
) -> tuple[Offsets, list[str]]:
    """Starts moved past offsets that no longer exist, and a line per partition saying so.

    With `fail` (failOnDataLoss), lost offsets raise DataLossError instead.
    """
    moved = dict(start)
    notices = []
    for tp, begin in start.items():
        first = log_start.get(tp, begin)
        stop = end.get(tp, begin)
        if begin >= first or begin >= stop:
            continue
        resume = min(first, stop)
        text = (
            f"{tp[0]}-{tp[1]}: offsets {begin} to {resume - 1} are no longer in {where} (the "
            f"log now starts at {first}): they were deleted (retention, DeleteRecords) before "
            "they were read"
        )
        if fail:
            raise DataLossError(
                f"{text}. The records are lost. To skip them and continue, set "
                "failOnDataLoss=false (kipside mirror: --no-fail-on-data-loss)"
            )
        notices.append(f"{text}; skipped {resume - begin} offsets (failOnDataLoss=false)")
        moved[tp] = resume
    return moved, notices


def _check_names_all(
    spec: OffsetSpec, given: Mapping[TopicPartition, object], partitions: list[TopicPartition]
) -> None:
    missing = sorted(set(partitions) - set(given))
    unknown = sorted(set(given) - set(partitions))
    if unknown:
        raise OptionError(
            f"option {spec.option} names {_names(unknown)}, which the subscription does not "
            f"read (it reads {_names(partitions)})"
        )
    if missing:
        raise OptionError(
            f"option {spec.option} must give every partition the subscription reads; missing "
            f"{_names(missing)}"
        )


def _names(tps: Iterable[TopicPartition]) -> str:
    items = [f"{t}-{p}" for t, p in tps]
    return ", ".join(items[:10]) + (f" and {len(items) - 10} more" if len(items) > 10 else "")


def _sample(names: Iterable[str]) -> str:
    items = sorted(names)
    if not items:
        return "none"
    return ", ".join(items[:10]) + (f" and {len(items) - 10} more" if len(items) > 10 else "")
