"""Transaction pre-registration and the transaction-begin hold, for rule-matched producers.

For a transactional id that matches a `transactions` rule, kipside tracks the producer id and
epoch the broker confirmed (InitProducerId, EndTxn v5), the partitions and groups registered in
the current transaction, and whether kipside opened it. On the client's first
AddPartitionsToTxn or AddOffsetsToTxn of a transaction, kipside sends one upstream
AddPartitionsToTxn covering the client's partitions plus the declared outputs, and the declared
group's AddOffsetsToTxn in parallel; later client calls that are already covered are answered
locally (exactly the requested partitions, error 0) without a round trip.

The begin hold: while the coordinator is still writing the previous transaction's markers it
answers CONCURRENT_TRANSACTIONS. kipside retries such a registration every few ms until
`hold_begin.max_ms`, then gives the client the real error, so the client never sleeps in its
own backoff. The client's slot stays in its connection's response order meanwhile.

Rules this module must never break (see shared kafka-rules.md "Transactions"): answer locally
only after the upstream registration under the same (producer id, epoch) succeeded; never answer
with an id or epoch the broker hasn't confirmed; end any transaction kipside opened that the
client doesn't know about; a declared topic that fails never breaks the client's transaction.
"""

from __future__ import annotations

import datetime
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Final, TypeVar

import trio
from kio.static.primitive import i16, i32, i32Timedelta
from opentelemetry.trace import Span

from kipside.protocol import (
    ApiKey,
    DecodeError,
    ErrorCode,
    Message,
    RequestHeader,
    api_name,
    build_frame,
    decode_request,
    decode_response,
    encode_message,
    encode_request_header,
    encode_response_header,
    error_name,
    parse_response_header,
    request_class,
    response_class,
)
from kipside.proxy.network.lanes import LanePool
from kipside.proxy.network.upstream import Pending, UpstreamFailed
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import event
from kipside.rules import RuleSet, TransactionRule

log = logging.getLogger("kipside.transactions")

TopicPartition = tuple[str, int]
T = TypeVar("T")

NONE: Final = 0
CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)
# Errors on a declared-only partition that mean the rule, not the client, is at fault.
RULE_PROBLEM_ERRORS: Final = frozenset(
    {
        int(ErrorCode.unknown_topic_or_partition),
        int(ErrorCode.topic_authorization_failed),
        int(ErrorCode.operation_not_attempted),
        int(ErrorCode.invalid_topic_exception),
    }
)
FENCING_ERRORS: Final = frozenset(
    {int(ErrorCode.invalid_producer_epoch), int(ErrorCode.producer_fenced)}
)
MAX_CLIENT_ADD_PARTITIONS_VERSION: Final = 3  # v4+ is broker-to-broker only
HOLD_FIRST_RETRY_SECONDS: Final = 0.002
HOLD_MAX_RETRY_SECONDS: Final = 0.010
METADATA_TTL_SECONDS: Final = 30.0


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


@dataclass(slots=True)
class _ClientAdd:
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


def _frame(api_key: int, version: int, message: Message, client_id: str) -> bytes:
    return build_frame(
        encode_request_header(api_key, version, 0, client_id), encode_message(message)
    )


def _response_frame(api_key: int, version: int, correlation_id: int, message: Message) -> bytes:
    header = encode_response_header(api_key, version, correlation_id)
    return build_frame(header, encode_message(message))


def _decode_answer(api_key: int, version: int, frame: bytes) -> Message:
    header = parse_response_header(frame, api_key, version)
    return decode_response(api_key, version, frame, header.body_offset)


class TransactionManager:
    def __init__(
        self,
        pools: Callable[[int], LanePool],
        rules: Callable[[], RuleSet],
        default_node: Callable[[], int | None],
        stats: Stats,
        nursery: trio.Nursery,
    ) -> None:
        self._pools = pools
        self._rules = rules
        self._default_node = default_node
        self.stats = stats
        self._nursery = nursery
        self._states: dict[str, TransactionState] = {}
        self._topic_partitions: dict[str, tuple[float, tuple[int, ...] | None]] = {}
        self._reported: set[str] = set()
        self._refused: dict[TopicPartition, float] = {}

    def active(self) -> bool:
        return bool(self._rules().transactions)

    def _rule(self, transactional_id: str | None) -> TransactionRule | None:
        if transactional_id is None:
            return None
        return self._rules().transaction_rule_for(transactional_id)

    def _state(self, transactional_id: str) -> TransactionState:
        state = self._states.get(transactional_id)
        if state is None:
            state = self._states[transactional_id] = TransactionState(transactional_id)
        return state

    # Routing -----------------------------------------------------------------------------

    def takes(self, header: RequestHeader) -> bool:
        if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            return header.api_version <= MAX_CLIENT_ADD_PARTITIONS_VERSION
        return header.api_key in (
            ApiKey.ADD_OFFSETS_TO_TXN,
            ApiKey.END_TXN,
            ApiKey.INIT_PRODUCER_ID,
        )

    async def route(
        self,
        node_id: int | None,
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
        txn_id = (
            request.v3_and_below_transactional_id
            if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN
            else request.transactional_id
        )
        rule = self._rule(txn_id)
        if rule is None or txn_id is None:
            return None
        target = node_id if node_id is not None else self._default_node()
        if target is None:
            return None
        pool = self._pools(target)
        state = self._state(txn_id)
        answer = Pending()
        if header.api_key not in (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN):
            self._spawn(answer, self._forward_and_track, pool, state, header, frame, answer)
            return answer
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
        add = _ClientAdd(
            pool,
            rule,
            state,
            header,
            request,
            answer,
            client_id or "kipside",
            producer,
            wanted,
            group,
            span,
        )
        covered = wanted <= state.partitions and (group is None or group in state.groups)
        if state.open and state.confirmed(producer) and covered:
            self.stats.txn_local_answers += 1
            event(span, "kipside.txn.answered_locally", partitions=len(wanted), group=group or "")
            self._answer(add, {}, {})
            return answer
        self._spawn(answer, self._client_add, add)
        return answer

    def _spawn(self, answer: Pending, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run fn in the background; a bug in it fails this one answer, never the proxy."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                log.exception("transaction handling failed; the client connection is closed")
                answer.fail(f"kipside error: {exc!r}")

        self._nursery.start_soon(guarded)

    # Tracking InitProducerId and EndTxn ---------------------------------------------------

    async def _forward_and_track(
        self,
        pool: LanePool,
        state: TransactionState,
        header: RequestHeader,
        frame: bytes,
        answer: Pending,
    ) -> None:
        async with state.lock:
            try:
                response = await pool.request(frame, header.api_key, header.api_version)
            except UpstreamFailed as exc:
                answer.fail(str(exc))
                return
            try:
                message = _decode_answer(header.api_key, header.api_version, response)
            except DecodeError as exc:
                log.warning(
                    "%s: unreadable %s answer: %s",
                    state.transactional_id,
                    api_name(header.api_key),
                    exc,
                )
                state.forget()
                answer.resolve(response)
                return
            if message.error_code == ErrorCode.none:
                state.reset()
                if header.api_key == ApiKey.INIT_PRODUCER_ID or hasattr(message, "producer_id"):
                    state.producer = Producer(int(message.producer_id), int(message.producer_epoch))
            elif (
                header.api_key == ApiKey.INIT_PRODUCER_ID
                or int(message.error_code) in FENCING_ERRORS
            ):
                state.forget()
            answer.resolve(response)

    # Registration ------------------------------------------------------------------------

    async def _client_add(self, add: _ClientAdd) -> None:
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
                self._answer(add, {}, {})
                return
            extra: set[TopicPartition] = set()
            if first:
                extra = await self._declared_outputs(add.pool, add.rule) - partitions
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
                partition_errors, group_errors = await self._register(
                    add, partitions, extra, groups
                )
            except UpstreamFailed as exc:
                add.answer.fail(str(exc))
                return
            client_ok = all(partition_errors.get(tp, NONE) == NONE for tp in add.wanted) and (
                add.group is None or group_errors.get(add.group, NONE) == NONE
            )
            fenced = FENCING_ERRORS & (set(partition_errors.values()) | set(group_errors.values()))
            if fenced:
                # The broker no longer accepts this producer epoch: nothing of ours to end.
                state.forget()
            elif first and not client_ok and (state.partitions or state.groups):
                # kipside opened a transaction the client thinks failed: end it.
                await self._abort_orphan(add.pool, state, add.producer, add.client_id)
            if not client_ok:
                codes = [c for c in (*partition_errors.values(), *group_errors.values()) if c]
                add.answer.error_name = error_name(codes[0]) if codes else None
            self._answer(add, partition_errors, group_errors)

    def _answer(
        self,
        add: _ClientAdd,
        partition_errors: dict[TopicPartition, int],
        group_errors: dict[str, int],
    ) -> None:
        header = add.header
        if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            add.answer.resolve(add_partitions_answer(header, add.request, partition_errors))
        else:
            assert add.group is not None
            add.answer.resolve(add_offsets_answer(header, group_errors.get(add.group, NONE)))

    async def _register(
        self,
        add: _ClientAdd,
        partitions: set[TopicPartition],
        extra: set[TopicPartition],
        groups: set[str],
    ) -> tuple[dict[TopicPartition, int], dict[str, int]]:
        """Register partitions (+ declared extras) and groups in parallel, holding through
        CONCURRENT_TRANSACTIONS until the rule's deadline."""
        state = add.state
        deadline = trio.current_time() + add.rule.hold_begin.max_ms / 1000
        partition_errors: dict[TopicPartition, int] = {}
        group_errors: dict[str, int] = {}
        version = MAX_CLIENT_ADD_PARTITIONS_VERSION
        if add.header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            version = min(add.header.api_version, MAX_CLIENT_ADD_PARTITIONS_VERSION)

        async def add_partitions() -> None:
            if not partitions and not extra:
                return
            attempt = partitions | extra
            while True:
                result = await self._held(
                    add.span,
                    "AddPartitionsToTxn",
                    deadline,
                    partial(self._add_partitions_once, add, version, frozenset(attempt)),
                    lambda r: all(code == CONCURRENT_TRANSACTIONS for code in r.values()),
                )
                failed = {tp for tp, code in result.items() if code != NONE}
                declared_only = attempt - partitions
                if failed and declared_only and self._rule_at_fault(result, declared_only):
                    refused = self._refused_outputs(add.rule, result, declared_only)
                    # Keep the declared outputs the broker did accept; only the refused ones
                    # (remembered for a while, so later transactions skip them) go.
                    attempt -= refused
                    if not attempt:
                        return
                    continue
                partition_errors.update(result)
                if not failed:
                    state.partitions |= attempt
                    state.open = True
                return

        async def add_offsets(group: str) -> None:
            code = await self._held(
                add.span,
                "AddOffsetsToTxn",
                deadline,
                partial(self._add_offsets_once, add, group),
                lambda c: c == CONCURRENT_TRANSACTIONS,
            )
            group_errors[group] = code
            if code == NONE:
                state.groups.add(group)
                state.open = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add_partitions)
            for group in groups:
                nursery.start_soon(add_offsets, group)
        if state.open:
            state.producer = add.producer
        return partition_errors, group_errors

    async def _held(
        self,
        span: Span | None,
        upstream_call: str,
        deadline: float,
        attempt: Callable[[], Awaitable[T]],
        concurrent: Callable[[T], bool],
    ) -> T:
        """Run attempt() until it isn't CONCURRENT_TRANSACTIONS or the deadline passes."""
        started = time.monotonic()
        delay = HOLD_FIRST_RETRY_SECONDS
        retries = 0
        while True:
            result = await attempt()
            if not concurrent(result) or trio.current_time() + delay > deadline:
                if retries:
                    held_for = time.monotonic() - started
                    self.stats.hold_seconds.observe(held_for)
                    event(
                        span,
                        "kipside.txn.hold.release",
                        upstream_call=upstream_call,
                        held_ms=round(held_for * 1000, 3),
                        retries=retries,
                        outcome="timed_out" if concurrent(result) else "ready",
                    )
                return result
            if not retries:
                self.stats.holds += 1
                event(span, "kipside.txn.hold.begin", upstream_call=upstream_call)
            retries += 1
            self.stats.hold_retries += 1
            await trio.sleep(delay)
            delay = min(delay * 2, HOLD_MAX_RETRY_SECONDS)

    def _rule_at_fault(
        self, result: dict[TopicPartition, int], declared: set[TopicPartition]
    ) -> bool:
        declared_codes = {result.get(tp, NONE) for tp in declared} - {NONE}
        return (
            bool(declared_codes)
            and declared_codes <= RULE_PROBLEM_ERRORS
            and any(
                result.get(tp) in RULE_PROBLEM_ERRORS - {int(ErrorCode.operation_not_attempted)}
                for tp in declared
            )
        )

    def _refused_outputs(
        self,
        rule: TransactionRule,
        result: dict[TopicPartition, int],
        declared: set[TopicPartition],
    ) -> set[TopicPartition]:
        """The declared outputs the broker refused: remembered, and reported once per rule."""
        refused = {
            tp
            for tp in declared
            if result.get(tp) not in (None, NONE, int(ErrorCode.operation_not_attempted))
        }
        now = trio.current_time()
        for tp in refused:
            self._refused[tp] = now
        self.stats.rule_problems += 1
        bad = sorted(f"{t}-{p} ({error_name(result[(t, p)])})" for t, p in refused)
        key = f"{rule.transactional_id}:{','.join(bad)}"
        if key not in self._reported:
            self._reported.add(key)
            log.warning(
                "transactions rule %r declares outputs the broker refused: %s; they are left "
                "out of pre-registration for %g s. Fix the rule file's outputs",
                rule.transactional_id,
                ", ".join(bad),
                METADATA_TTL_SECONDS,
            )
        return refused

    async def _add_partitions_once(
        self, add: _ClientAdd, version: int, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        pool, state, client_id = add.pool, add.state, add.client_id
        producer = add.producer
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(partitions):
            by_topic.setdefault(topic, []).append(partition)
        cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, version)
        topic_cls = _field_class(cls, "v3_and_below_topics")
        message = cls(
            v3_and_below_transactional_id=state.transactional_id,
            v3_and_below_producer_id=producer.id,
            v3_and_below_producer_epoch=i16(producer.epoch),
            v3_and_below_topics=tuple(
                topic_cls(name=name, partitions=tuple(i32(p) for p in ps))
                for name, ps in by_topic.items()
            ),
        )
        frame = await pool.request(
            _frame(ApiKey.ADD_PARTITIONS_TO_TXN, version, message, client_id),
            ApiKey.ADD_PARTITIONS_TO_TXN,
            version,
        )
        response = _decode_answer(ApiKey.ADD_PARTITIONS_TO_TXN, version, frame)
        return {
            (topic.name, int(p.partition_index)): int(p.partition_error_code)
            for topic in response.results_by_topic_v3_and_below
            for p in topic.results_by_partition
        }

    async def _add_offsets_once(self, add: _ClientAdd, group: str) -> int:
        pool, state, client_id = add.pool, add.state, add.client_id
        producer = add.producer
        version = 0
        cls = request_class(ApiKey.ADD_OFFSETS_TO_TXN, version)
        message = cls(
            transactional_id=state.transactional_id,
            producer_id=producer.id,
            producer_epoch=i16(producer.epoch),
            group_id=group,
        )
        frame = await pool.request(
            _frame(ApiKey.ADD_OFFSETS_TO_TXN, version, message, client_id),
            ApiKey.ADD_OFFSETS_TO_TXN,
            version,
        )
        return int(_decode_answer(ApiKey.ADD_OFFSETS_TO_TXN, version, frame).error_code)

    async def _abort_orphan(
        self, pool: LanePool, state: TransactionState, producer: Producer, client_id: str
    ) -> None:
        cls = request_class(ApiKey.END_TXN, 0)
        message = cls(
            transactional_id=state.transactional_id,
            producer_id=producer.id,
            producer_epoch=i16(producer.epoch),
            committed=False,
        )
        try:
            frame = await pool.request(
                _frame(ApiKey.END_TXN, 0, message, client_id), ApiKey.END_TXN, 0
            )
            code = _decode_answer(ApiKey.END_TXN, 0, frame).error_code
        except (UpstreamFailed, DecodeError) as exc:
            code = f"failed: {exc}"
        log.warning(
            "%s: the client's registration failed after kipside had registered %d partitions "
            "and %d groups; kipside aborted that transaction (EndTxn: %s)",
            state.transactional_id,
            len(state.partitions),
            len(state.groups),
            code,
        )
        state.reset()

    # Declared outputs --------------------------------------------------------------------

    async def _declared_outputs(self, pool: LanePool, rule: TransactionRule) -> set[TopicPartition]:
        out = await self._all_declared_outputs(pool, rule)
        now = trio.current_time()
        return {
            tp
            for tp in out
            if now - self._refused.get(tp, -METADATA_TTL_SECONDS) >= METADATA_TTL_SECONDS
        }

    async def _all_declared_outputs(
        self, pool: LanePool, rule: TransactionRule
    ) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for output in rule.outputs:
            if output.partitions is not None:
                out.update((output.topic, p) for p in output.partitions)
                continue
            partitions = await self._partitions_of(pool, output.topic)
            if partitions is None:
                key = f"{rule.transactional_id}:{output.topic}:missing"
                if key not in self._reported:
                    self._reported.add(key)
                    self.stats.rule_problems += 1
                    log.warning(
                        "transactions rule %r declares topic %r, which the broker does not "
                        "know; it is left out of pre-registration. Fix the rule file's outputs",
                        rule.transactional_id,
                        output.topic,
                    )
                continue
            out.update((output.topic, p) for p in partitions)
        return out

    async def _partitions_of(self, pool: LanePool, topic: str) -> tuple[int, ...] | None:
        cached = self._topic_partitions.get(topic)
        now = trio.current_time()
        if cached is not None and now - cached[0] < METADATA_TTL_SECONDS:
            return cached[1]
        version = 4  # the first version that can say "don't auto-create"
        cls = request_class(ApiKey.METADATA, version)
        topic_cls = _field_class(cls, "topics")
        message = cls(topics=(topic_cls(name=topic),), allow_auto_topic_creation=False)
        try:
            frame = await pool.request(
                _frame(ApiKey.METADATA, version, message, "kipside"), ApiKey.METADATA, version
            )
            response = _decode_answer(ApiKey.METADATA, version, frame)
        except (UpstreamFailed, DecodeError) as exc:
            log.warning("cannot read partitions of %r: %s", topic, exc)
            return cached[1] if cached is not None else None
        partitions: tuple[int, ...] | None = None
        for entry in response.topics:
            if entry.name == topic and entry.error_code == ErrorCode.none:
                partitions = tuple(sorted(int(p.partition_index) for p in entry.partitions))
        self._topic_partitions[topic] = (now, partitions)
        return partitions


_ZERO = datetime.timedelta(0)


# Answers --------------------------------------------------------------------------------
# Public: the tests' fault-injecting relays answer for a simulated broker with these same frames.


def add_partitions_answer(
    header: RequestHeader, request: Message, errors: dict[TopicPartition, int]
) -> bytes:
    """An AddPartitionsToTxn v0-3 response frame answering `request` (sent with `header`):
    exactly the requested partitions, in request order, with their error (0 if none)."""
    cls = response_class(ApiKey.ADD_PARTITIONS_TO_TXN, header.api_version)
    topic_cls = _field_class(cls, "results_by_topic_v3_and_below")
    partition_cls = _field_class(topic_cls, "results_by_partition")
    message = cls(
        throttle_time=i32Timedelta.parse(_ZERO),
        results_by_topic_v3_and_below=tuple(
            topic_cls(
                name=topic.name,
                results_by_partition=tuple(
                    partition_cls(
                        partition_index=p,
                        partition_error_code=ErrorCode(errors.get((topic.name, int(p)), NONE)),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.v3_and_below_topics
        ),
    )
    return _response_frame(
        ApiKey.ADD_PARTITIONS_TO_TXN, header.api_version, header.correlation_id, message
    )


def add_offsets_answer(header: RequestHeader, code: int) -> bytes:
    """An AddOffsetsToTxn response frame answering the request sent with `header`."""
    cls = response_class(ApiKey.ADD_OFFSETS_TO_TXN, header.api_version)
    message = cls(throttle_time=i32Timedelta.parse(_ZERO), error_code=ErrorCode(code))
    return _response_frame(
        ApiKey.ADD_OFFSETS_TO_TXN, header.api_version, header.correlation_id, message
    )


def _field_class(cls: type, name: str) -> type:
    """The element class of a (possibly nullable) tuple-of-entities field on a kio class."""
    hint = typing.get_type_hints(cls)[name]
    while typing.get_origin(hint) is not tuple:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    element: type = typing.get_args(hint)[0]
    return element
