"""read_committed for one partition, decided from the log itself, sans-I/O.

A read_committed consumer must never see records of an aborted transaction, nor any control
batch. Apache Kafka helps with the Fetch response's AbortedTransactions list; some brokers send
none (Tansu 0.6.0 sends an empty list even when the fetched range holds an aborted transaction).
The log itself always has the answer: each producer's transactional batches are followed by a
control batch, COMMIT or ABORT, that ends its transaction. So this filter holds a producer's
transactional batches until that marker arrives, then releases or drops them, and keeps log
order: nothing after an undecided batch is released before it (as a broker never serves a
read_committed consumer past the last stable offset).

Feed batches in log order with `feed`; a broker's aborted list, when it sends one, goes to
`add_aborted` first and decides those transactions without waiting for their markers. `take`
returns everything decided at the head, in log order. Batches past the range being read may be
fed with `feed_marker` so only their markers count. Never does I/O, never decompresses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from .fetch import AbortedTransaction
from .records import ControlType, RecordBatchView, control_type

__all__ = ["Decided", "ReadCommittedFilter", "Verdict"]


class Verdict(Enum):
    DATA = "data"
    """Committed (or not transactional): readable."""
    ABORTED = "aborted"
    """Part of an aborted transaction: never shown to a read_committed reader."""
    CONTROL = "control"
    """A transaction marker: never shown to any reader."""


@dataclass(frozen=True, slots=True)
class Decided:
    batch: RecordBatchView
    verdict: Verdict


@dataclass(slots=True)
class _Held:
    batch: RecordBatchView
    verdict: Verdict | None  # None: waiting for its producer's marker


class ReadCommittedFilter:
    """Decides which batches of one partition a reader may see; `committed_only=False` makes
    it pass every data batch (read_uncommitted) and drop only control batches."""

    __slots__ = ("_aborted_from", "_committed_only", "_held", "_open")

    def __init__(self, *, committed_only: bool = True) -> None:
        self._committed_only = committed_only
        self._held: deque[_Held] = deque()
        self._open: dict[int, list[_Held]] = {}  # producer id -> its undecided batches
        # producer id -> first offsets of its aborted transactions (the broker's list), ascending
        self._aborted_from: dict[int, list[int]] = {}

    @property
    def undecided(self) -> bool:
        """Whether some fed batch still waits for its producer's marker."""
        return bool(self._open)

    @property
    def waiting_for(self) -> dict[int, int]:
        """Producer id -> offset of its first batch still waiting for a marker."""
        return {pid: held[0].batch.base_offset for pid, held in self._open.items()}

    def add_aborted(self, aborted: Iterable[AbortedTransaction]) -> None:
        """The broker's AbortedTransactions list for the range about to be fed."""
        for entry in aborted:
            starts = self._aborted_from.setdefault(entry.producer_id, [])
            if entry.first_offset not in starts:
                starts.append(entry.first_offset)
                starts.sort()

    def feed(self, batch: RecordBatchView) -> None:
        """The next batch of the partition, in log order."""
        if batch.is_control:
            self._end_transaction(batch)
            self._held.append(_Held(batch, Verdict.CONTROL))
            return
        if not (self._committed_only and batch.is_transactional):
            self._held.append(_Held(batch, Verdict.DATA))
            return
        pid = batch.producer_id
        starts = self._aborted_from.get(pid)
        if starts and batch.base_offset >= starts[0]:
            self._held.append(_Held(batch, Verdict.ABORTED))
            return
        held = _Held(batch, None)
        self._held.append(held)
        self._open.setdefault(pid, []).append(held)

    def feed_marker(self, batch: RecordBatchView) -> None:
        """A batch past the range being read: only a marker matters, nothing is released."""
        if batch.is_control:
            self._end_transaction(batch)

    def take(self) -> list[Decided]:
        """Every decided batch at the head of the log, in log order."""
        out = []
        held = self._held
        while held and held[0].verdict is not None:
            entry = held.popleft()
            assert entry.verdict is not None
            out.append(Decided(entry.batch, entry.verdict))
        return out

    def _end_transaction(self, marker: RecordBatchView) -> None:
        pid = marker.producer_id
        kind = control_type(marker)
        if kind not in (ControlType.COMMIT, ControlType.ABORT):
            return  # not a transaction marker
        verdict = Verdict.DATA if kind == ControlType.COMMIT else Verdict.ABORTED
        for entry in self._open.pop(pid, ()):
            entry.verdict = verdict
        # The broker's list names where an aborted transaction began; its marker ends it.
        starts = self._aborted_from.get(pid)
        if kind == ControlType.ABORT and starts and starts[0] <= marker.base_offset:
            starts.pop(0)
