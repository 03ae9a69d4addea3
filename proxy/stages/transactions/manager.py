"""The transaction feature's front: which transaction requests kipside takes, and for whom.

It takes AddPartitionsToTxn (v0-3), AddOffsetsToTxn, EndTxn and InitProducerId of the
transactional ids a `transactions` rule matches. Covered adds are answered locally at once;
other adds go to pre-registration (stages.transactions.registration); InitProducerId
and EndTxn are forwarded on a lane and their answers tracked. Everything else, and every
request of an unmatched transactional id, is forwarded untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import trio
from opentelemetry.trace import Span

from kipside.protocol import ApiKey, DecodeError, RequestHeader, api_name, decode_request
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.identity import Principal
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.stages.transactions.messages import (
    MAX_CLIENT_ADD_PARTITIONS_VERSION,
    decode_answer,
    transactional_id,
)
from kipside.proxy.stages.transactions.outputs import DeclaredOutputs
from kipside.proxy.stages.transactions.registration import ClientAdd, Registrar
from kipside.proxy.stages.transactions.state import TransactionState
from kipside.proxy.telemetry.tracing import event
from kipside.proxy.upstream.lanes import LanePool
from kipside.rules import TransactionRule

log = logging.getLogger("kipside.transactions")

_ADDS = (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN)


TAKEN_APIS: Final = frozenset(
    {
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.INIT_PRODUCER_ID,
    }
)
"""The transaction calls the manager may take (`takes` says which it does)."""


class TransactionManager:
    def __init__(self, context: FeatureContext) -> None:
        self.context = context
        self.registrar = Registrar(context.stats, DeclaredOutputs(context.stats))
        # Per principal too: a transactional id's state is never shared across identities.
        self._states: dict[tuple[Principal, str], TransactionState] = {}

    def active(self) -> bool:
        return bool(self.context.rules().transactions)

    def takes(self, header: RequestHeader) -> bool:
        """Whether this is a call the manager takes (the APIs of TAKEN_APIS, at the versions it
        speaks)."""
        if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            return header.api_version <= MAX_CLIENT_ADD_PARTITIONS_VERSION
        return header.api_key in TAKEN_APIS

    def _rule(self, transactional_id: str | None) -> TransactionRule | None:
        if transactional_id is None:
            return None
        return self.context.rules().transaction_rule_for(transactional_id)

    def _state(self, principal: Principal, transactional_id: str) -> TransactionState:
        state = self._states.get((principal, transactional_id))
        if state is None:
            state = TransactionState(transactional_id)
            self._states[(principal, transactional_id)] = state
        return state

    def route(
        self,
        node_id: int | None,
        principal: Principal,
        frame: bytes,
        header: RequestHeader,
        client_id: str | None,
        span: Span | None = None,
    ) -> Pending | None:
        """The answer to a transaction request kipside handles, or None to forward it as is."""
        if not self.takes(header):
            return None
        try:
            request = decode_request(header.api_key, header.api_version, frame, header.body_offset)
        except DecodeError:
            return None
        txn_id = transactional_id(header, request)
        rule = self._rule(txn_id)
        if rule is None or txn_id is None:
            return None
        target = self.context.node_for(node_id)
        if target is None:
            return None
        pool = self.context.pools(target, principal)
        state = self._state(principal, txn_id)
        if header.api_key not in _ADDS:
            answer = Pending()
            self._spawn(answer, self._forward_and_track, pool, state, header, frame, answer)
            return answer
        add = ClientAdd.read(pool, rule, state, header, request, client_id or "kipside", span)
        if add.covered():
            self.context.stats.txn_local_answers += 1
            event(
                span,
                "kipside.txn.answered_locally",
                partitions=len(add.wanted),
                group=add.group or "",
            )
            add.resolve()
        else:
            self._spawn(add.answer, self.registrar.client_add, add)
        return add.answer

    def _spawn(self, answer: Pending, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run fn in the background; a bug in it fails this one answer, never the proxy."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                log.exception("transaction handling failed; the client connection is closed")
                answer.fail(f"kipside error: {exc!r}")

        self.context.nursery.start_soon(guarded)

    async def _forward_and_track(
        self,
        pool: LanePool,
        state: TransactionState,
        header: RequestHeader,
        frame: bytes,
        answer: Pending,
    ) -> None:
        """Forward the client's InitProducerId or EndTxn and learn from the broker's answer."""
        async with state.lock:
            try:
                response = await pool.request(frame, header.api_key, header.api_version)
            except UpstreamFailed as exc:
                answer.fail(str(exc))
                return
            try:
                message = decode_answer(header.api_key, header.api_version, response)
            except DecodeError as exc:
                log.warning(
                    "%s: unreadable %s answer: %s",
                    state.transactional_id,
                    api_name(header.api_key),
                    exc,
                )
                state.forget()
            else:
                state.track(header.api_key, message, trio.current_time(), pool.node_id)
            answer.resolve(response)
