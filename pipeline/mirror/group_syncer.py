"""The I/O of continuous consumer-group sync (--sync-groups): a thread of the mirror's driver.

Each round reads the offset syncs written since the last one (read committed), lists the source
groups the pattern matches, reads their committed offsets, asks the destination whether each
group has active members and what it has committed there, lets pipeline.mirror.group_sync
decide, and commits (OffsetCommit without a member, as kafka-consumer-groups does). A round
runs at once, then at most every interval, and a last one when the mirror stops. A failure (a
cluster unreachable, a group that gained members meanwhile) is a warning for that round or that
group, never the mirror's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kipside.pipeline.kafka.admin import (
    commit_group_offsets,
    committed_offsets,
    group_has_members,
    list_groups,
)
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import KafkaError

from .group_sync import GroupPlan, Schedule, matching, plan
from .offset_sync import SyncIndex
from .translate import read_syncs

__all__ = ["GroupSyncer", "SyncTotals"]


@dataclass
class SyncTotals:
    rounds: int = 0
    commits: int = 0
    """Partition offsets committed on the destination."""
    groups: int = 0
    """Groups that got at least one commit."""


class GroupSyncer:
    def __init__(
        self,
        pattern: str,
        interval: float,
        source: KafkaClient,
        dest: KafkaClient,
        sync_topic: str,
        cluster: str,
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pattern = pattern
        self.source = source
        self.dest = dest
        self.sync_topic = sync_topic
        self.warn = warn
        self.clock = clock
        self.schedule = Schedule(interval)
        self.index = SyncIndex(cluster)
        self.totals = SyncTotals()
        self._position: int | None = None
        self._synced: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kipside-group-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the rounds, then run a last one: what the last micro-batches copied is synced
        before the mirror exits (after --once, the groups are in place for a failover)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._round_warning_on_failure()
        self.source.close()
        self.dest.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            if self.schedule.due(now):
                self.schedule.ran(now)
                self._round_warning_on_failure()
            self._stop.wait(min(1.0, self.schedule.interval))

    def _round_warning_on_failure(self) -> None:
        try:
            self.round()
        except KafkaError as exc:
            self.warn(f"--sync-groups: this round failed: {exc}")
        except Exception as exc:  # a bug must not end the thread unseen
            self.warn(f"--sync-groups: this round failed: {type(exc).__name__}: {exc}")

    def round(self) -> list[GroupPlan]:
        """One round: read new syncs, then plan and commit each matching group."""
        try:
            syncs, _foreign, self._position = read_syncs(self.dest, self.sync_topic, self._position)
        except KafkaError:
            if self._position is None:
                return []  # no sync topic yet: nothing mirrored, nothing to translate
            raise
        self.index.extend(syncs)
        plans = []
        for group in matching(self.pattern, list_groups(self.source)):
            try:
                plans.append(self._sync(group))
            except KafkaError as exc:
                self.warn(f"--sync-groups: group {group!r} not synced this round: {exc}")
        self.totals.rounds += 1
        return plans

    def _sync(self, group: str) -> GroupPlan:
        source_offsets = committed_offsets(self.source, group)
        if not source_offsets:
            return GroupPlan(group)
        active = group_has_members(self.dest, group)
        dest_offsets = {} if active else committed_offsets(self.dest, group)
        decided = plan(group, self.index, source_offsets, dest_offsets, dest_active=active)
        if decided.commits:
            commit_group_offsets(self.dest, group, decided.commits)
            self.totals.commits += len(decided.commits)
            self._synced.add(group)
            self.totals.groups = len(self._synced)
        return decided
