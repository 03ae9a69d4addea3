"""Pre-registration: a client's first AddPartitionsToTxn/AddOffsetsToTxn of a transaction
becomes one upstream AddPartitionsToTxn covering its partitions plus the rule's declared
outputs, and the declared group's AddOffsetsToTxn, in parallel (one round trip), under one
begin hold: sent when the coordinator is expected to be ready, then one question at a time
while it answers CONCURRENT_TRANSACTIONS.

The client is answered only after the upstream registration under the same (producer id,
epoch) succeeded; a transaction kipside opened that the client thinks failed is aborted, and a
declared output the broker refuses never fails the client's call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Final

import trio
from opentelemetry.trace import Span

from kipside.protocol import ApiKey, DecodeError, Message, RequestHeader, error_name
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.begin_window import AT_ONCE, HoldSchedule
from kipside.proxy.stages.transactions.answers import add_offsets_answer, add_partitions_answer
from kipside.proxy.stages.transactions.hold import CONCURRENT_TRANSACTIONS, Ask, BeginHold
from kipside.proxy.stages.transactions.messages import (
    ADD_OFFSETS_VERSION,
    DESCRIBE_TRANSACTIONS_VERSION,
    END_TXN_VERSION,
    MAX_CLIENT_ADD_PARTITIONS_VERSION,
    abort_request,
    add_offsets_request,
    add_partitions_errors,
    add_partitions_request,
    decode_answer,
    describe_transactions_request,
    markers_written,
)
from kipside.proxy.stages.transactions.outputs import DeclaredOutputs, rule_at_fault
from kipside.proxy.stages.transactions.state import (
    FENCING_ERRORS,
    Producer,
    TopicPartition,
    TransactionState,
)
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import event
from kipside.proxy.upstream.lanes import LanePool
from kipside.rules import TransactionRule

log = logging.getLogger("kipside.transactions")

NONE: Final = 0

Errors = tuple[dict[TopicPartition, int], dict[str, int]]
"""What a registration got back: each partition's error code, each group's."""


@dataclass(slots=True)
class ClientAdd:
    """One client AddPartitionsToTxn/AddOffsetsToTxn being registered upstream."""

    pool: LanePool
    rule: TransactionRule
    state: TransactionState
    header: RequestHeader
    request: Message
    answer: Pending
    client_id: str
    producer: Producer
    wanted: set[TopicPartition]
    group: str | None
    span: Span | None
    lane: int | None = None
    """The lane the registration's calls share: the broker gets them one after the other
    on one connection, never two of one transactional id at once (Apache Kafka refuses an
    add while the id's previous one is still being logged: CONCURRENT_TRANSACTIONS)."""

    @classmethod
    def read(
        cls,
        pool: LanePool,
        rule: TransactionRule,
        state: TransactionState,
        header: RequestHeader,
        request: Message,
        client_id: str,
        span: Span | None,
    ) -> ClientAdd:
        """The add a decoded AddPartitionsToTxn (v0-3) or AddOffsetsToTxn request asks for."""
        if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            wanted = {
                (topic.name, int(p))
                for topic in request.v3_and_below_topics
                for p in topic.partitions
            }
            group = None
            producer = Producer(
                int(request.v3_and_below_producer_id), int(request.v3_and_below_producer_epoch)
            )
        else:
            wanted, group = set(), str(request.group_id)
            producer = Producer(int(request.producer_id), int(request.producer_epoch))
        answer = Pending()
        return cls(
            pool, rule, state, header, request, answer, client_id, producer, wanted, group, span
        )

    def covered(self) -> bool:
        """Everything asked for is registered in the open transaction of this producer."""
        state = self.state
        covered = self.wanted <= state.partitions and (
            self.group is None or self.group in state.groups
        )
        return state.open and state.confirmed(self.producer) and covered

    def resolve(self, errors: Errors | None = None) -> None:
        """Answer the client: exactly what it asked for, each with its error (0 if none)."""
        partition_errors, group_errors = errors if errors is not None else ({}, {})
        if self.header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            self.answer.resolve(add_partitions_answer(self.header, self.request, partition_errors))
        else:
            assert self.group is not None
            code = group_errors.get(self.group, NONE)
            self.answer.resolve(add_offsets_answer(self.header, code))


class Registrar:
    """Registers client adds upstream, first adds with the rule's declared outputs."""

    def __init__(self, stats: Stats, outputs: DeclaredOutputs) -> None:
        self.stats = stats
        self.outputs = outputs

    async def client_add(self, add: ClientAdd) -> None:
        state = add.state
        async with state.lock:
            if not state.confirmed(add.producer):
                # A new producer id/epoch (or one kipside never saw): start from scratch.
                state.reset()
            first = not state.open
            partitions = set(add.wanted) - state.partitions
            groups = {add.group} - state.groups if add.group is not None else set()
            if not first and not partitions and not groups:
                # Covered by a registration that finished while this call waited for it.
                self.stats.txn_local_answers += 1
                event(add.span, "kipside.txn.answered_locally", waited=True)
                add.resolve()
                return
            extra: set[TopicPartition] = set()
            if first:
                extra = await self.outputs.usable(add.pool, add.rule) - partitions
                if add.rule.consumer_group is not None:
                    groups.add(add.rule.consumer_group)
                self.stats.txn_preregistrations += 1
                event(
                    add.span,
                    "kipside.txn.preregistered",
                    client_partitions=len(partitions),
                    declared_partitions=len(extra),
                    groups=",".join(sorted(groups)),
                )
            try:
                errors = await self._register(add, partitions, extra, groups)
            except UpstreamFailed as exc:
                add.answer.fail(str(exc))
                return
            await self._settle(add, first, errors)

    async def _settle(self, add: ClientAdd, first: bool, errors: Errors) -> None:
        """Answer the client with the registration's outcome, after ending (or forgetting) a
        transaction kipside opened that the client will not carry on."""
        state = add.state
        partition_errors, group_errors = errors
        client_ok = all(partition_errors.get(tp, NONE) == NONE for tp in add.wanted) and (
            add.group is None or group_errors.get(add.group, NONE) == NONE
        )
        fenced = FENCING_ERRORS & (set(partition_errors.values()) | set(group_errors.values()))
        if fenced:
            # The broker no longer accepts this producer epoch: nothing of ours to end.
            state.forget()
        elif first and not client_ok and (state.partitions or state.groups):
            # kipside opened a transaction the client thinks failed: end it.
            await self._abort_orphan(add)
        if not client_ok:
            codes = [c for c in (*partition_errors.values(), *group_errors.values()) if c]
            add.answer.error_name = error_name(codes[0]) if codes else None
        add.resolve(errors)

    async def _register(
        self,
        add: ClientAdd,
        partitions: set[TopicPartition],
        extra: set[TopicPartition],
        groups: set[str],
    ) -> Errors:
        """Register partitions (+ declared extras) and groups in parallel, a transaction's
        first registration when the coordinator is expected to accept it, holding through
        CONCURRENT_TRANSACTIONS until the rule's deadline, the calls sharing one probe."""
        now = trio.current_time()
        state = add.state
        first = not state.open
        add.lane = add.pool.next_short_lane()
        ask: Ask | None = None
        plan = AT_ONCE
        if first:
            can_ask = state.can_ask and add.pool.offers(
                ApiKey.DESCRIBE_TRANSACTIONS, DESCRIBE_TRANSACTIONS_VERSION
            )
            plan = state.window.plan(now, can_ask=can_ask)
            ask = partial(self._ask, add) if can_ask else None
        deadline = now + add.rule.hold_begin.max_ms / 1000
        schedule = HoldSchedule(now, deadline, asking=ask is not None)
        hold = BeginHold(self.stats, add.span, schedule, plan, ask)
        errors: Errors = ({}, {})
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold.run, nursery)
                nursery.start_soon(self._add_partitions, add, hold, partitions, extra, errors[0])
                for group in groups:
                    nursery.start_soon(self._add_offsets, add, hold, group, errors[1])
        except* UpstreamFailed as failed:
            # A lost lane is the client's answer (its connection is closed, it retries), not a
            # kipside error: the first such failure, out of the nursery's group.
            first_failure: BaseException = failed
            while isinstance(first_failure, BaseExceptionGroup):
                first_failure = first_failure.exceptions[0]
            raise first_failure from None
        if first:
            state.window.learn(hold.attempts)
        if state.open:
            state.producer = add.producer
        return errors

    async def _ask(self, add: ClientAdd) -> bool | None:
        """Whether the coordinator has written the markers of the id's last transaction
        (DescribeTransactions); None, and no more asking for this id, if it won't say."""
        state = add.state
        request = describe_transactions_request(state.transactional_id, add.client_id)
        try:
            frame = await add.pool.request(
                request, ApiKey.DESCRIBE_TRANSACTIONS, DESCRIBE_TRANSACTIONS_VERSION, add.lane
            )
            ready = markers_written(frame, state.transactional_id)
        except (UpstreamFailed, DecodeError) as exc:
            log.info("%s: DescribeTransactions failed: %s", state.transactional_id, exc)
            ready = None
        if ready is None and state.can_ask:
            state.can_ask = False
            log.info(
                "%s: the coordinator gave no transaction state; the begin hold asks with "
                "registrations instead",
                state.transactional_id,
            )
        return ready

    async def _add_partitions(
        self,
        add: ClientAdd,
        hold: BeginHold,
        partitions: set[TopicPartition],
        extra: set[TopicPartition],
        errors: dict[TopicPartition, int],
    ) -> None:
        if not partitions and not extra:
            return
        version = MAX_CLIENT_ADD_PARTITIONS_VERSION
        if add.header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            version = min(add.header.api_version, MAX_CLIENT_ADD_PARTITIONS_VERSION)
        attempt = partitions | extra
        while True:
            result = await hold.call(
                "AddPartitionsToTxn",
                partial(self._add_partitions_once, add, version, frozenset(attempt)),
                lambda r: all(code == CONCURRENT_TRANSACTIONS for code in r.values()),
            )
            failed = {tp for tp, code in result.items() if code != NONE}
            declared_only = attempt - partitions
            if failed and declared_only and rule_at_fault(result, declared_only):
                # Keep the declared outputs the broker did accept; only the refused ones
                # (remembered for a while, so later transactions skip them) go.
                attempt -= self.outputs.refuse(add.rule, result, declared_only)
                if not attempt:
                    return
                continue
            errors.update(result)
            if not failed:
                add.state.partitions |= attempt
                add.state.open = True
            return

    async def _add_offsets(
        self, add: ClientAdd, hold: BeginHold, group: str, errors: dict[str, int]
    ) -> None:
        code = await hold.call(
            "AddOffsetsToTxn",
            partial(self._add_offsets_once, add, group),
            lambda c: c == CONCURRENT_TRANSACTIONS,
        )
        errors[group] = code
        if code == NONE:
            add.state.groups.add(group)
            add.state.open = True

    async def _add_partitions_once(
        self, add: ClientAdd, version: int, partitions: frozenset[TopicPartition]
    ) -> dict[TopicPartition, int]:
        request = add_partitions_request(
            add.state.transactional_id, add.producer, version, partitions, add.client_id
        )
        frame = await add.pool.request(request, ApiKey.ADD_PARTITIONS_TO_TXN, version, add.lane)
        return add_partitions_errors(version, frame)

    async def _add_offsets_once(self, add: ClientAdd, group: str) -> int:
        request = add_offsets_request(
            add.state.transactional_id, add.producer, group, add.client_id
        )
        frame = await add.pool.request(
            request, ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS_VERSION, add.lane
        )
        answer = decode_answer(ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS_VERSION, frame)
        return int(answer.error_code)

    async def _abort_orphan(self, add: ClientAdd) -> None:
        state = add.state
        request = abort_request(state.transactional_id, add.producer, add.client_id)
        try:
            frame = await add.pool.request(request, ApiKey.END_TXN, END_TXN_VERSION)
            code = decode_answer(ApiKey.END_TXN, END_TXN_VERSION, frame).error_code
        except (UpstreamFailed, DecodeError) as exc:
            code = f"failed: {exc}"
        else:
            if code == NONE:  # the coordinator now writes the abort markers
                state.window.ended(trio.current_time(), add.pool.node_id)
        log.warning(
            "%s: the client's registration failed after kipside had registered %d partitions "
            "and %d groups; kipside aborted that transaction (EndTxn: %s)",
            state.transactional_id,
            len(state.partitions),
            len(state.groups),
            code,
        )
        state.reset()
