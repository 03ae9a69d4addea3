"""What kipside knows of one rule-matched transactional id.

The producer id and epoch the broker last confirmed (InitProducerId, EndTxn v5), and what
kipside registered upstream in the current transaction. It must never hold an id or epoch the
broker hasn't confirmed: anything it cannot read makes it forget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import trio

from kipside.protocol import ApiKey, ErrorCode, Message
from kipside.proxy.core.begin_window import BeginWindow

TopicPartition = tuple[str, int]

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
    window: BeginWindow = field(default_factory=BeginWindow)
    """The coordinator's marker window after this id's EndTxn, as learned (trio clock)."""
    can_ask: bool = True
    """The coordinator answers DescribeTransactions for this id (until it refuses one)."""

    def reset(self) -> None:
        self.open = False
        self.partitions.clear()
        self.groups.clear()

    def forget(self) -> None:
        """Nothing kipside knew is confirmed any more (fenced, or an answer it cannot read)."""
        self.reset()
        self.producer = None
        self.window.no_window()

    def confirmed(self, producer: Producer) -> bool:
        return producer == self.producer

    def track(self, api_key: int, answer: Message, now: float, coordinator: int) -> None:
        """Learn from the broker's answer to the client's InitProducerId or EndTxn, received
        at `now` (trio clock) from node `coordinator`.

        Success ends the transaction kipside knew of and, where the answer carries one (EndTxn
        v5 under KIP-890), confirms the next producer id and epoch; a failed InitProducerId or
        a fencing error leaves nothing confirmed.
        """
        if answer.error_code == ErrorCode.none:
            self.reset()
            if api_key == ApiKey.END_TXN:
                self.window.ended(now, coordinator)
            else:
                self.window.no_window()
                self.can_ask = True
            if api_key == ApiKey.INIT_PRODUCER_ID or hasattr(answer, "producer_id"):
                self.producer = Producer(int(answer.producer_id), int(answer.producer_epoch))
        elif api_key == ApiKey.INIT_PRODUCER_ID or int(answer.error_code) in FENCING_ERRORS:
            self.forget()
