"""What continuous consumer-group sync (--sync-groups) commits, decided in memory.

At most every --sync-groups-interval, for each source consumer group whose name matches the
pattern, the group's committed source offsets are translated through the offset syncs
(pipeline.mirror.offset_sync) into destination offsets, and committed to the same group on the
destination, following MirrorMaker 2's rules (sync.group.offsets.enabled):

- a group with active members on the destination is never touched (its consumers own their
  offsets there: the failover has happened);
- a destination offset never moves backwards: a partition whose translated offset is not ahead
  of what the group has committed there already is left alone;
- a partition nothing was mirrored of is left out.

`plan` makes the decision for one group from plain values; `Schedule` says when a round is due
on whatever clock it is given. The I/O (listing groups, reading and committing offsets) is
pipeline.mirror.group_syncer's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .offset_sync import SyncIndex

__all__ = ["GroupPlan", "Schedule", "matching", "plan"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class GroupPlan:
    group: str
    commits: dict[TopicPartition, int] = field(default_factory=dict)
    """Destination partition -> offset to commit."""
    behind: int = 0
    """Partitions left alone because the destination is already there or further."""
    unmirrored: int = 0
    """Partitions with a committed source offset but nothing mirrored."""
    active: bool = False
    """The group has members on the destination: nothing is committed."""


def matching(pattern: str, groups: list[str]) -> list[str]:
    """The group names the pattern matches whole (as --topics matches topics)."""
    compiled = re.compile(pattern)
    return sorted(g for g in groups if compiled.fullmatch(g))


def plan(
    group: str,
    index: SyncIndex,
    source_offsets: Mapping[TopicPartition, int],
    dest_offsets: Mapping[TopicPartition, int],
    *,
    dest_active: bool,
) -> GroupPlan:
    """The commits that move `group` forward on the destination, per the rules above."""
    if dest_active:
        return GroupPlan(group, active=True)
    commits: dict[TopicPartition, int] = {}
    behind = unmirrored = 0
    for (topic, partition), offset in sorted(source_offsets.items()):
        translated = index.translate(topic, partition, offset)
        if translated is None:
            unmirrored += 1
            continue
        where = (translated.dest_topic, translated.dest_partition)
        current = dest_offsets.get(where)
        if current is not None and translated.dest_offset <= current:
            behind += 1
            continue
        commits[where] = translated.dest_offset
    return GroupPlan(group, commits, behind, unmirrored)


@dataclass
class Schedule:
    """Rounds at most every `interval` seconds of the clock passed in (the first at once)."""

    interval: float
    last: float | None = None

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= self.interval

    def ran(self, now: float) -> None:
        self.last = now
