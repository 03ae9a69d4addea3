"""What kipside knows of one rule-matched transactional id.

The producer id and epoch the broker last confirmed (InitProducerId, EndTxn v5), and what
kipside registered upstream in the current transaction. It must never hold an id or epoch the
broker hasn't confirmed: anything it cannot read makes it forget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

import trio

from kipside.protocol import ApiKey, ErrorCode, Message

TopicPartition = tuple[str, int]

WINDOWS_KEPT: Final = 3
"""Recent marker windows remembered per transactional id: the shortest is expected next, so a
long outlier costs no wait."""

FENCING_ERRORS: Final = frozenset(
    {int(ErrorCode.invalid_producer_epoch), int(ErrorCode.producer_fenced)}
)


@dataclass(frozen=True, slots=True)
class Producer:
    """A producer id and epoch, as InitProducerId gave them to a transactional client."""

    id: int
    epoch: int


@dataclass(slots=True)
class TransactionState:
    transactional_id: str
    producer: Producer | None = None
    """The producer the broker last confirmed for this transactional id; None: none known."""
    open: bool = False
    """kipside registered something upstream for the current transaction."""
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    lock: trio.Lock = field(default_factory=trio.Lock)
    ended_at: float | None = None
    """When (trio clock) the broker answered this id's last EndTxn without error."""
    windows: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOWS_KEPT))
    """How long after an EndTxn the coordinator still refused the next transaction's first
    registration, for the last few transactions (0: it did not refuse it)."""

    def window_end(self) -> float | None:
        """When (trio clock) the coordinator is expected to accept this id's next transaction:
        the shortest recent window after the last EndTxn; None when no window is expected."""
        if self.open or self.ended_at is None or not self.windows:
            return None
        shortest = min(self.windows)
        return self.ended_at + shortest if shortest > 0 else None

    def reset(self) -> None:
        self.open = False
        self.partitions.clear()
        self.groups.clear()

    def forget(self) -> None:
        """Nothing kipside knew is confirmed any more (fenced, or an answer it cannot read)."""
        self.reset()
        self.producer = None

    def confirmed(self, producer: Producer) -> bool:
        return producer == self.producer

    def track(self, api_key: int, answer: Message, now: float) -> None:
        """Learn from the broker's answer to the client's InitProducerId or EndTxn, received
        at `now` (trio clock).

        Success ends the transaction kipside knew of and, where the answer carries one (EndTxn
        v5 under KIP-890), confirms the next producer id and epoch; a failed InitProducerId or
        a fencing error leaves nothing confirmed.
        """
        if answer.error_code == ErrorCode.none:
            self.reset()
            self.ended_at = now if api_key == ApiKey.END_TXN else None
            if api_key == ApiKey.INIT_PRODUCER_ID or hasattr(answer, "producer_id"):
                self.producer = Producer(int(answer.producer_id), int(answer.producer_epoch))
        elif api_key == ApiKey.INIT_PRODUCER_ID or int(answer.error_code) in FENCING_ERRORS:
            self.forget()
