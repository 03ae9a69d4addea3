"""Transactions seen in a capture, and the coordinator round trips each one took.

A transaction of a transactional id runs from the first coordinator call after its previous
transaction ended up to an EndTxn the coordinator answered with NONE (committed or aborted as
the request said). Its round trips are the transaction coordinator's calls in that span:
AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, each request counted once, whatever the answer
(a call refused with CONCURRENT_TRANSACTIONS and retried is two). Calls after the last end are
an open transaction when the capture stops. Memory is one entry per transactional id with a
transaction open.
"""

from __future__ import annotations

from dataclasses import dataclass

from kipside.protocol import ApiKey

from .decode import TRANSACTION_CALLS, RequestSeen, ResponseSeen

__all__ = ["TransactionFigures", "TransactionTracker"]


@dataclass
class TransactionFigures:
    ended: int = 0
    """Transactions whose EndTxn the coordinator answered with NONE."""
    committed: int = 0
    aborted: int = 0
    round_trips: int = 0
    """Coordinator round trips of the ended transactions."""
    open: int = 0
    """Transactions with calls after their id's last end when the capture stopped."""
    open_round_trips: int = 0

    @property
    def round_trips_per_transaction(self) -> float | None:
        return self.round_trips / self.ended if self.ended else None


class TransactionTracker:
    """Counts coordinator calls per transactional id between the ends of its transactions."""

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._figures = TransactionFigures()

    def request(self, request: RequestSeen) -> None:
        txn_id = request.transactional_id
        if request.api_key in TRANSACTION_CALLS and txn_id is not None:
            self._calls[txn_id] = self._calls.get(txn_id, 0) + 1

    def response(self, request: RequestSeen, response: ResponseSeen) -> None:
        txn_id = request.transactional_id
        if request.api_key != ApiKey.END_TXN or txn_id is None or response.problem is not None:
            return
        if response.error_codes != {0}:
            return
        figures = self._figures
        figures.ended += 1
        if request.committed:
            figures.committed += 1
        else:
            figures.aborted += 1
        figures.round_trips += self._calls.pop(txn_id, 0)

    def figures(self) -> TransactionFigures:
        open_calls = [n for n in self._calls.values() if n]
        figures = self._figures
        return TransactionFigures(
            figures.ended,
            figures.committed,
            figures.aborted,
            figures.round_trips,
            len(open_calls),
            sum(open_calls),
        )
