"""Transactions (issue 4) end to end: real clients -> kipside -> MarkerWindowRelay -> Tansu.

kipside pre-registers a rule-matched transaction's declared outputs and consumer group on the
client's first AddPartitionsToTxn/AddOffsetsToTxn, answers later covered calls itself, and holds
a registration through CONCURRENT_TRANSACTIONS (the coordinator still writing the previous
transaction's markers) until the rule's hold_begin.max_ms. Tansu 0.6.0 has no marker-writing
window, so every test here puts a MarkerWindowRelay (tests/txn_relay.py, a fault-injecting
SIMULATION of Apache Kafka's coordinator) between kipside and a dedicated Tansu: for W ms after
each successful EndTxn it answers that transactional id's AddPartitionsToTxn/AddOffsetsToTxn
with CONCURRENT_TRANSACTIONS itself, and it counts, independently of kipside, what kipside sent
upstream per transaction.

What the clients themselves saw is read from their own logs: librdkafka's `eos` debug log (one
line per AddPartitionsToTxn/AddOffsetsToTxn answer that carried an error) and kafka-python's
TransactionManager DEBUG records (the decoded response objects). The hold-timeout test is the
positive control that both counters do see CONCURRENT_TRANSACTIONS when a client gets it.

Tansu 0.6.0 sends no AbortedTransactions in Fetch responses, so read_committed consumers also
return aborted records (a broker limitation, seen without kipside; test_clients.py). The output
log is therefore also read "by hand": every record with its producer id, and the commit/abort
control markers, resolved the way read_committed is specified.

The last test checks the relay itself (raw socket, no kipside): response order on a connection,
header versions, correlation ids, the unknown-topic refusal and the optional delay.

Run: .venv/bin/pytest tests/integration/test_transactions.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import re
import socket
import struct
import time
import typing
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import confluent_kafka as ck
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from conftest import (
    DirectProbe,
    Kipside,
    create_topics,
    skip_unless_shared_lanes,
    start_kipside,
    unique_name,
)
from kio.static.primitive import i16, i32, i64
from relaykit.tansu import tansu_behind
from testkit.broker import Broker, start_tansu
from testkit.metrics import Metrics, scrape
from testkit.ports import free_port
from txn_relay import CONCURRENT_TRANSACTIONS, MarkerWindowRelay, TxnSegment

from kipside.protocol.apis import ApiKey
from kipside.protocol.headers import (
    build_frame,
    encode_request_header,
    parse_response_header,
    response_correlation_id,
)
from kipside.protocol.messages import decode_response, encode_message, request_class
from kipside.protocol.primitives import read_uvarint
from kipside.protocol.records import iter_batches

from .clients import (
    Msg,
    assert_exactly_once_in_order,
    call_with_deadline,
    ck_config,
    ck_consumer,
    consume_assigned,
    fetch_partition,
    kp_common,
    kp_producer,
    read_frame,
)

pytestmark = pytest.mark.integration

CLIENTS = ["confluent-kafka", "kafka-python"]  # aiokafka's transactions fail on Tansu itself
WINDOW_MS = 50.0  # the simulated marker-writing window after each EndTxn
OUT_PARTITIONS = 8
INPUT_RECORDS = 160
ABORT_EVERY = 5  # attempts 0, 5, 10, ... are aborted: 160 inputs -> 200 transactions
TRANSACTIONS = INPUT_RECORDS * ABORT_EVERY // (ABORT_EVERY - 1)
HOLD_MAX_MS = 5000
CTP_DEADLINE = 100.0  # one whole consume-transform-produce run
CALL_TIMEOUT = 15.0  # one client call (commit, abort, flush, send offsets)
TIMEOUT_WINDOW_MS = 2000.0  # hold-timeout test: a window far longer than the hold
TIMEOUT_HOLD_MAX_MS = 100

# librdkafka's eos debug log names the error by its description (rd_kafka_err2str) or its name.
RDKAFKA_CONCURRENT = re.compile(
    r"CONCURRENT_TRANSACTIONS|another concurrent operation on the same transaction"
)


# --------------------------------------------------------------------------- the stack


@dataclass
class TxnStack:
    """Tansu advertising the relay, the relay in front of it, kipside in front of the relay."""

    relay: MarkerWindowRelay
    broker: Broker  # bootstrap = the relay: what kipside dials and what Tansu advertises
    kipside: Kipside
    admin_port: int

    @property
    def bootstrap(self) -> str:
        return self.kipside.bootstrap

    def metrics(self) -> Metrics:
        """kipside's /metrics."""
        return scrape(self.admin_port)

    def api_metric(self, name: str, api: str) -> float:
        return self.metrics().value(name, 0.0, api=api)


class Output(NamedTuple):
    topic: str
    partitions: tuple[int, ...] | None = None  # None: every partition


def rules_yaml(transactional_id: str, outputs: list[Output], group: str | None, max_ms: int) -> str:
    lines = ["transactions:", f'  - transactional_id: "{transactional_id}"', "    outputs:"]
    for out in outputs:
        lines.append(f"      - topic: {out.topic}")
        if out.partitions is not None:
            lines.append(f"        partitions: [{', '.join(map(str, out.partitions))}]")
    if group is not None:
        lines.append(f"    consumer_group: {group}")
    lines.append(f"    hold_begin: {{max_ms: {max_ms}}}")
    return "\n".join(lines) + "\n"


StackFactory = Callable[..., TxnStack]


def assert_no_kipside_errors(kipside: Kipside) -> list[str]:
    """kipside logged nothing at ERROR and no traceback; returns its WARNING lines."""
    lines = kipside.log().splitlines()
    bad = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln or "Traceback" in ln]
    assert not bad, "kipside logged errors:\n" + "\n".join(bad[:10])
    return [ln for ln in lines if " WARNING " in ln]


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[StackFactory]:
    """make_stack(rules_text, window_ms=WINDOW_MS) -> a new TxnStack; all stopped at the end
    (kipside must exit 0 on SIGTERM)."""
    skip_unless_shared_lanes("transaction pre-registration")
    made: list[Kipside] = []
    brokers = contextlib.ExitStack()

    def make(rules_text: str, window_ms: float = WINDOW_MS) -> TxnStack:
        relay = MarkerWindowRelay(window_ms=window_ms)
        tansu = brokers.enter_context(tansu_behind(relay))
        workdir = tmp_path / f"stack{len(made) + 1}"
        workdir.mkdir()
        rules = workdir / "rules.yaml"
        rules.write_text(rules_text)
        admin_port = free_port()
        via_relay = replace(tansu, port=relay.port)
        kipside = start_kipside(
            via_relay, workdir, rules=rules, extra_args=["--admin", f"127.0.0.1:{admin_port}"]
        )
        made.append(kipside)
        stdout = kipside.stdout_path.read_text()
        assert f"kipside: admin listening on http://127.0.0.1:{admin_port}" in stdout, stdout
        return TxnStack(relay, via_relay, kipside, admin_port)

    with brokers:
        try:
            yield make
            for kipside in made:
                code = kipside.stop()
                assert code == 0, f"kipside exited with {code}:\n{kipside.log()[-3000:]}"
        finally:
            for kipside in made:
                if kipside.proc.poll() is None:
                    kipside.proc.kill()


# --------------------------------------------------------------------------- client logs


class RdkafkaLog(logging.Handler):
    """librdkafka's log lines for one client (config: {"debug": "eos", "logger": .logger})."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"kipside-tests.rdkafka.{uuid.uuid4().hex[:8]}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def concurrent(self) -> list[str]:
        """The answers carrying CONCURRENT_TRANSACTIONS this client got (one line each)."""
        return [line for line in self.lines if RDKAFKA_CONCURRENT.search(line)]

    def conf(self) -> dict[str, Any]:
        return {"debug": "eos", "logger": self.logger}


class KafkaPythonTxnLog(logging.Handler):
    """kafka-python's TransactionManager DEBUG records: every transactional response it
    received ("Received transactional response %s for request %s"), decoded."""

    LOGGER = "kafka.producer.transaction_manager"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.responses: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Received transactional response") and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            self.responses.append(args[0])

    @contextlib.contextmanager
    def attached(self) -> Iterator[KafkaPythonTxnLog]:
        logger = logging.getLogger(self.LOGGER)
        level, propagate = logger.level, logger.propagate
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # keep thousands of DEBUG records out of pytest's capture
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate

    def concurrent(self) -> list[str]:
        """The responses carrying CONCURRENT_TRANSACTIONS this client got."""
        return [type(r).__name__ for r in self.responses if CONCURRENT_TRANSACTIONS in _codes(r)]

    def kinds(self) -> Counter[str]:
        return Counter(type(r).__name__ for r in self.responses)


def _codes(response: Any) -> set[int]:
    """Every error code in a kafka-python transactional response object."""
    codes = set()
    if isinstance(getattr(response, "error_code", None), int):
        codes.add(response.error_code)
    for topic in getattr(response, "results_by_topic_v3_and_below", None) or ():
        for partition in topic.results_by_partition:
            codes.add(int(partition.partition_error_code))
    return codes


# --------------------------------------------------------------------------- the log, by hand


class LogRecord(NamedTuple):
    offset: int
    producer_id: int
    transactional: bool
    control: int | None  # control batches: 0 abort marker, 1 commit marker
    key: bytes | None
    value: bytes | None


@dataclass
class ResolvedLog:
    """One partition's log resolved as read_committed is specified (markers per producer)."""

    committed: list[bytes] = field(default_factory=list)
    aborted: list[bytes] = field(default_factory=list)
    still_open: list[bytes] = field(default_factory=list)
    commit_markers: int = 0
    abort_markers: int = 0


def _svarint(buf: memoryview, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def _records(batch: Any) -> Iterator[LogRecord]:
    assert batch.compression == 0, "the tests produce uncompressed batches"
    buf = batch.records
    pos = 0
    for _ in range(batch.records_count):
        length, pos = _svarint(buf, pos)
        end = pos + length
        pos += 1  # attributes
        _ts, pos = _svarint(buf, pos)
        delta, pos = _svarint(buf, pos)
        fields: list[bytes | None] = []
        for _field in ("key", "value"):
            size, pos = _svarint(buf, pos)
            fields.append(None if size < 0 else bytes(buf[pos : pos + size]))
            pos += max(size, 0)
        pos = end  # headers are not needed
        key, value = fields
        control = None
        if batch.is_control:
            assert key is not None and len(key) >= 4, key
            control = struct.unpack(">h", key[2:4])[0]
        yield LogRecord(
            batch.base_offset + delta,
            batch.producer_id,
            batch.is_transactional,
            control,
            key,
            value,
        )


def read_log(bootstrap: str, topic: str, partition: int, timeout: float = 30.0) -> list[LogRecord]:
    """Every record of one partition, control records included: Fetch v4, read_uncommitted,
    over a plain socket, from offset 0 to the high watermark."""
    host, port = bootstrap.rsplit(":", 1)
    out: list[LogRecord] = []
    offset = 0
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for correlation_id in itertools.count(1):
            assert time.monotonic() < deadline, f"{topic}[{partition}]: log not read in time"
            data = fetch_partition(sock, topic, partition, offset, correlation_id)
            for batch in iter_batches(data.records, allow_partial_tail=True):
                out.extend(r for r in _records(batch) if r.offset >= offset)
                offset = max(offset, batch.base_offset + batch.last_offset_delta + 1)
            if offset >= data.high_watermark:
                return out
    raise AssertionError("unreachable")


def resolve(records: list[LogRecord]) -> ResolvedLog:
    out = ResolvedLog()
    pending: dict[int, list[bytes]] = {}
    for r in sorted(records, key=lambda r: r.offset):
        if r.control is not None:
            batch = pending.pop(r.producer_id, [])
            if r.control == 1:
                out.commit_markers += 1
                out.committed.extend(batch)
            else:
                out.abort_markers += 1
                out.aborted.extend(batch)
        elif r.transactional:
            pending.setdefault(r.producer_id, []).append(r.value or b"")
        else:
            out.committed.append(r.value or b"")
    for values in pending.values():
        out.still_open.extend(values)
    return out


# ------------------------------------------------------------ consume-transform-produce


@dataclass(frozen=True)
class Attempt:
    number: int
    input_offset: int
    input_value: bytes
    committed: bool

    def steps(self) -> tuple[str, str]:
        """Odd attempts send the offsets before producing: then the transaction's first
        registration is the client's AddOffsetsToTxn instead of its AddPartitionsToTxn."""
        return ("offsets", "produce") if self.number % 2 else ("produce", "offsets")

    def output(self, partition: int) -> Msg:
        value = self.input_value + f"|a{self.number:03d}|p{partition}".encode()
        return Msg(partition, self.input_value, value)


@dataclass
class CtpRun:
    client: str
    txn_id: str
    input_topic: str
    output_topic: str
    group: str
    attempts: list[Attempt] = field(default_factory=list)
    client_concurrent: list[str] = field(default_factory=list)
    committed_offsets_seen: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0
    client_detail: str = ""


class OffsetChecker:
    """Reads the group's committed offset for the input partition (its own consumer)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = ck_consumer(bootstrap, group)
        self.topic = topic

    def committed(self) -> int:
        (tp,) = self.consumer.committed([ck.TopicPartition(self.topic, 0)], timeout=10)
        assert tp.error is None, tp.error
        return int(tp.offset)

    def close(self) -> None:
        self.consumer.close()


def _ctp_topics(stack: TxnStack, run: CtpRun) -> None:
    """The output topic and the input topic with its INPUT_RECORDS records."""
    create_topics(stack.bootstrap, [run.output_topic], OUT_PARTITIONS)
    create_topics(stack.bootstrap, [run.input_topic], 1)
    p = ck.Producer(ck_config(stack.bootstrap, **{"linger.ms": 5}))
    for i in range(INPUT_RECORDS):
        p.produce(run.input_topic, value=f"in-{i:04d}".encode(), partition=0)
    assert p.flush(30) == 0


def _plan(attempt: int) -> bool:
    """Commit (True) or abort (False) this attempt."""
    return attempt % ABORT_EVERY != 0


def _check_offsets_after(run: CtpRun, checker: OffsetChecker, expected: int) -> None:
    got = checker.committed()
    if got == ck.OFFSET_INVALID and expected == 0:
        got = 0  # nothing committed yet
    run.committed_offsets_seen.append((expected, got))
    assert got == expected, (
        f"after attempt {len(run.attempts) - 1} the group's committed offset is {got}, "
        f"expected {expected}"
    )


def run_ctp_confluent(stack: TxnStack, run: CtpRun) -> None:
    log = RdkafkaLog()
    producer = ck.Producer(
        ck_config(
            stack.bootstrap,
            **{
                "transactional.id": run.txn_id,
                "linger.ms": 1,
                "transaction.timeout.ms": 60000,
                "message.timeout.ms": 15000,
                **log.conf(),
            },
        )
    )
    consumer = ck_consumer(stack.bootstrap, run.group, **{"isolation.level": "read_committed"})
    checker = OffsetChecker(stack.bootstrap, run.group, run.input_topic)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    try:
        consumer.assign([ck.TopicPartition(run.input_topic, 0, 0)])
        group_metadata = consumer.consumer_group_metadata()
        producer.init_transactions(CALL_TIMEOUT)
        started = time.monotonic()
        deadline = started + CTP_DEADLINE
        position = 0
        while position < INPUT_RECORDS:
            assert time.monotonic() < deadline, f"{len(run.attempts)} transactions in time"
            message = _ck_next_input(consumer, position, deadline)
            attempt = Attempt(
                len(run.attempts), position, message.value(), _plan(len(run.attempts))
            )
            producer.begin_transaction()
            for step in attempt.steps():
                if step == "produce":
                    for partition in range(OUT_PARTITIONS):
                        out = attempt.output(partition)
                        producer.produce(
                            run.output_topic,
                            value=out.value,
                            key=out.key,
                            partition=partition,
                            on_delivery=on_delivery,
                        )
                    assert producer.flush(CALL_TIMEOUT) == 0, "undelivered output"
                    assert not errors, errors[:3]
                else:
                    producer.send_offsets_to_transaction(
                        [ck.TopicPartition(run.input_topic, 0, position + 1)],
                        group_metadata,
                        CALL_TIMEOUT,
                    )
            run.attempts.append(attempt)
            if attempt.committed:
                producer.commit_transaction(CALL_TIMEOUT)
                position += 1
                if position % 40 == 0:
                    _check_offsets_after(run, checker, position)
            else:
                producer.abort_transaction(CALL_TIMEOUT)
                # Reprocess the input: back to the last committed position.
                consumer.seek(ck.TopicPartition(run.input_topic, 0, position))
                _check_offsets_after(run, checker, position)
        run.seconds = time.monotonic() - started
        producer.flush(5)  # serves the last log lines
    finally:
        consumer.close()
        checker.close()
    run.client_concurrent = log.concurrent()
    run.client_detail = f"{len(log.lines)} librdkafka eos log lines"


def _ck_next_input(consumer: ck.Consumer, position: int, deadline: float) -> Any:
    """The input record at `position` (messages fetched before a seek are skipped)."""
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert message.error() is None, message.error()
        if message.offset() == position:
            return message
    raise AssertionError(f"input record at offset {position} never arrived")


def run_ctp_kafka_python(stack: TxnStack, run: CtpRun) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    log = KafkaPythonTxnLog()
    checker = OffsetChecker(stack.bootstrap, run.group, run.input_topic)
    with log.attached():
        producer = kp_producer(
            stack.bootstrap,
            transactional_id=run.txn_id,
            linger_ms=1,
            transaction_timeout_ms=60000,
        )
        consumer = KafkaConsumer(
            **kp_common(stack.bootstrap),
            group_id=None,  # kafka-python's group consume returns nothing on Tansu
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_poll_records=1,
            isolation_level="read_committed",
        )
        tp = TopicPartition(run.input_topic, 0)
        try:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            call_with_deadline(producer.init_transactions, CALL_TIMEOUT, "init_transactions")
            started = time.monotonic()
            deadline = started + CTP_DEADLINE
            position = 0
            while position < INPUT_RECORDS:
                assert time.monotonic() < deadline, f"{len(run.attempts)} transactions in time"
                record = _kp_next_input(consumer, tp, position, deadline)
                attempt = Attempt(
                    len(run.attempts), position, record.value, _plan(len(run.attempts))
                )
                producer.begin_transaction()
                for step in attempt.steps():
                    if step == "produce":
                        futures = []
                        for partition in range(OUT_PARTITIONS):
                            out = attempt.output(partition)
                            futures.append(
                                producer.send(
                                    run.output_topic,
                                    value=out.value,
                                    key=out.key,
                                    partition=partition,
                                )
                            )
                        producer.flush(timeout=CALL_TIMEOUT)
                        for future in futures:
                            future.get(timeout=1)
                    else:
                        call_with_deadline(
                            functools.partial(
                                producer.send_offsets_to_transaction,
                                {tp: OffsetAndMetadata(position + 1, "", -1)},
                                run.group,
                            ),
                            CALL_TIMEOUT,
                            "send_offsets_to_transaction",
                        )
                run.attempts.append(attempt)
                if attempt.committed:
                    call_with_deadline(
                        producer.commit_transaction, CALL_TIMEOUT, "commit_transaction"
                    )
                    position += 1
                    if position % 40 == 0:
                        _check_offsets_after(run, checker, position)
                else:
                    call_with_deadline(
                        producer.abort_transaction, CALL_TIMEOUT, "abort_transaction"
                    )
                    consumer.seek(tp, position)
                    _check_offsets_after(run, checker, position)
            run.seconds = time.monotonic() - started
        finally:
            consumer.close(autocommit=False)
            producer.close(timeout=5)
            checker.close()
    run.client_concurrent = log.concurrent()
    run.client_detail = f"transactional responses: {dict(log.kinds())}"


def _kp_next_input(consumer: Any, tp: Any, position: int, deadline: float) -> Any:
    while time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200, max_records=1).values():
            for record in records:
                if record.offset == position:
                    return record
                consumer.seek(tp, position)  # a record from before the last seek
    raise AssertionError(f"input record at offset {position} never arrived")


def _expected_outputs(run: CtpRun, committed: bool) -> list[Msg]:
    return [
        a.output(p) for a in run.attempts if a.committed == committed for p in range(OUT_PARTITIONS)
    ]


def _assert_read_committed_view(
    who: str, view: list[Msg], run: CtpRun, direct_probe: DirectProbe
) -> int:
    """A read_committed consumer's view: every committed record once, in order; the only
    other records allowed are aborted ones, and only where the broker itself shows them."""
    committed = _expected_outputs(run, True)
    aborted_values = {m.value for m in _expected_outputs(run, False)}
    committed_values = {m.value for m in committed}
    strangers = [m for m in view if m.value not in committed_values | aborted_values]
    assert not strangers, f"{who} read records nobody produced: {strangers[:3]}"
    assert_exactly_once_in_order(committed, [m for m in view if m.value in committed_values])
    shown_aborted = [m for m in view if m.value in aborted_values]
    if shown_aborted:
        ok, detail = direct_probe("read-committed-filters-aborted")
        assert not ok, (
            f"{who} read_committed returned {len(shown_aborted)} aborted records, but the broker "
            f"filters them without kipside ({detail})"
        )
    return len(shown_aborted)


@pytest.mark.parametrize("client", CLIENTS)
def test_consume_transform_produce(
    client: str,
    make_stack: StackFactory,
    request: pytest.FixtureRequest,
    direct_probe: DirectProbe,
) -> None:
    """200 consume-transform-produce transactions (every 5th aborted, the input then
    reprocessed), each writing all 8 output partitions and the input offset (half of them
    sending the offsets first), through kipside with a 50 ms simulated marker window after
    every EndTxn.

    Asserts: the output log holds exactly the committed attempts' records (once, in order)
    behind commit markers and the aborted ones behind abort markers; read_committed consumers
    see every committed record exactly once; the group's committed offset follows the commits
    only (checked after every abort and at the end); the client never saw
    CONCURRENT_TRANSACTIONS although the relay answered it to kipside in most transactions;
    kipside sent exactly one accepted AddPartitionsToTxn and one AddOffsetsToTxn upstream per
    transaction."""
    prefix = "ctp-" + client.replace("-", "")
    run = CtpRun(
        client=client,
        txn_id=unique_name(prefix),
        input_topic=unique_name("in", request),
        output_topic=unique_name("out", request),
        group=unique_name("g", request),
    )
    rules = rules_yaml(f"{prefix}-*", [Output(run.output_topic)], run.group, HOLD_MAX_MS)
    stack = make_stack(rules)
    _ctp_topics(stack, run)
    if client == "confluent-kafka":
        run_ctp_confluent(stack, run)
    else:
        run_ctp_kafka_python(stack, run)
    stack.kipside.assert_alive()
    assert not assert_no_kipside_errors(stack.kipside)

    # -- the plan ran: 200 transactions, 160 commits, every input consumed once committed
    assert len(run.attempts) == TRANSACTIONS
    assert [a.committed for a in run.attempts] == [_plan(i) for i in range(TRANSACTIONS)]

    # -- what kipside sent upstream, per transaction, seen by the relay
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    segments = relay.segments(run.txn_id)
    ended = [s for s in segments if s.end is not None]
    assert len(ended) == TRANSACTIONS, f"{len(ended)} EndTxn answered, {len(segments)} segments"
    assert [s.end.committed for s in ended if s.end] == [a.committed for a in run.attempts]
    assert all(not _has_events(s) for s in segments if s.end is None), segments[-1]
    over = [
        (i, s)
        for i, s in enumerate(ended)
        if s.accepted_add_partitions != 1 or s.accepted_add_offsets != 1
    ]
    assert not over, f"transactions without exactly 1+1 accepted upstream adds: {over[:5]}"
    rejected = sum(s.rejected_add_partitions + s.rejected_add_offsets for s in ended)
    held_txns = sum(1 for s in ended if s.rejected_add_partitions or s.rejected_add_offsets)
    assert rejected > 0 and held_txns > 0, "the simulated marker window was never hit"

    # -- what the client saw: no CONCURRENT_TRANSACTIONS at all
    assert not run.client_concurrent, (
        f"{client} saw CONCURRENT_TRANSACTIONS {len(run.client_concurrent)} times, e.g. "
        f"{run.client_concurrent[:2]}"
    )

    # -- kipside's own counters agree with the relay's
    counts = relay.counts()
    upstream_adds = stack.api_metric("kipside_upstream_requests_total", "AddPartitionsToTxn")
    client_adds = stack.api_metric("kipside_client_requests_total", "AddPartitionsToTxn")
    assert upstream_adds == counts.accepted_add_partitions + counts.rejected_add_partitions
    assert client_adds >= TRANSACTIONS

    # -- the output log, resolved by hand
    for partition in range(OUT_PARTITIONS):
        log = resolve(read_log(stack.bootstrap, run.output_topic, partition))
        want = [a.output(partition).value for a in run.attempts if a.committed]
        want_aborted = [a.output(partition).value for a in run.attempts if not a.committed]
        assert log.committed == want, f"partition {partition}: committed records differ"
        assert log.aborted == want_aborted, f"partition {partition}: aborted records differ"
        assert not log.still_open, f"partition {partition}: {len(log.still_open)} undecided"
        assert (log.commit_markers, log.abort_markers) == (
            INPUT_RECORDS,
            TRANSACTIONS - INPUT_RECORDS,
        )

    # -- read_committed consumers
    expect = INPUT_RECORDS * OUT_PARTITIONS
    read = (stack.bootstrap, run.output_topic, OUT_PARTITIONS, expect, "read_committed", 60)
    view, _ = consume_assigned(*read)
    shown_aborted = _assert_read_committed_view("confluent-kafka", view, run, direct_probe)
    if client == "kafka-python":
        view, _ = consume_assigned(*read, client="kafka-python")
        _assert_read_committed_view("kafka-python", view, run, direct_probe)

    # -- the group's offsets, as an admin client reads them
    admin = AdminClient(ck_config(stack.bootstrap))
    request_offsets = ConsumerGroupTopicPartitions(
        run.group, [ck.TopicPartition(run.input_topic, 0)]
    )
    (future,) = admin.list_consumer_group_offsets([request_offsets], request_timeout=10).values()
    (tp,) = future.result(timeout=15).topic_partitions
    assert (tp.error, tp.offset) == (None, INPUT_RECORDS)

    print(
        f"\n[{client}] {len(run.attempts)} transactions in {run.seconds:.1f} s; upstream per "
        f"transaction: AddPartitionsToTxn {counts.accepted_add_partitions / TRANSACTIONS:.2f}, "
        f"AddOffsetsToTxn {counts.accepted_add_offsets / TRANSACTIONS:.2f} accepted; "
        f"in-window rejections: {counts.rejected_add_partitions} AddPartitionsToTxn + "
        f"{counts.rejected_add_offsets} AddOffsetsToTxn over {held_txns} held transactions; "
        f"client AddPartitionsToTxn {client_adds:.0f}; client-seen CONCURRENT_TRANSACTIONS "
        f"{len(run.client_concurrent)} ({run.client_detail}); "
        f"offset checks {len(run.committed_offsets_seen)}; aborted records a read_committed "
        f"consumer returned (broker limitation): {shown_aborted}"
    )


def _has_events(segment: TxnSegment) -> bool:
    return bool(
        segment.accepted_add_partitions
        or segment.rejected_add_partitions
        or segment.refused_add_partitions
        or segment.accepted_add_offsets
        or segment.rejected_add_offsets
    )


# --------------------------------------------------------------------------- simple transactions


class TxnClient:
    """One transactional producer of either client library, with deadlines on every call and
    a count of the CONCURRENT_TRANSACTIONS answers it received."""

    def __init__(self, client: str, bootstrap: str, txn_id: str) -> None:
        self.client = client
        self.bootstrap = bootstrap
        self.rdkafka_log: RdkafkaLog | None = None
        self.kp_log: KafkaPythonTxnLog | None = None
        self._kp_attached: contextlib.ExitStack = contextlib.ExitStack()
        if client == "confluent-kafka":
            self.rdkafka_log = RdkafkaLog()
            conf = {
                "transactional.id": txn_id,
                "linger.ms": 1,
                "message.timeout.ms": 15000,
                **self.rdkafka_log.conf(),
            }
            self.ck = ck.Producer(ck_config(bootstrap, **conf))
        else:
            self.kp_log = KafkaPythonTxnLog()
            self._kp_attached.enter_context(self.kp_log.attached())
            self.kp = kp_producer(bootstrap, transactional_id=txn_id, linger_ms=1)

    def init(self) -> None:
        if self.client == "confluent-kafka":
            self.ck.init_transactions(CALL_TIMEOUT)
        else:
            call_with_deadline(self.kp.init_transactions, CALL_TIMEOUT, "init_transactions")

    def produce_in_transaction(
        self, topic: str, values: list[tuple[int, bytes]], begin: bool = True
    ) -> None:
        """begin (unless begin=False), send each (partition, value), flush: raises what the
        client raises."""
        if self.client == "confluent-kafka":
            errors: list[Any] = []
            if begin:
                self.ck.begin_transaction()
            for partition, value in values:
                self.ck.produce(
                    topic,
                    value=value,
                    partition=partition,
                    on_delivery=lambda err, _m: errors.append(err) if err else None,
                )
            left = self.ck.flush(CALL_TIMEOUT)
            if errors:
                raise ck.KafkaException(errors[0])
            assert left == 0, f"{left} undelivered"
        else:
            if begin:
                self.kp.begin_transaction()
            futures = [self.kp.send(topic, value=v, partition=p) for p, v in values]
            self.kp.flush(timeout=CALL_TIMEOUT)
            for future in futures:
                future.get(timeout=1)

    def send_offsets(self, topic: str, offset: int, group: str) -> None:
        if self.client == "confluent-kafka":
            consumer = ck_consumer(self.bootstrap, group)
            try:
                self.ck.send_offsets_to_transaction(
                    [ck.TopicPartition(topic, 0, offset)],
                    consumer.consumer_group_metadata(),
                    CALL_TIMEOUT,
                )
            finally:
                consumer.close()
        else:
            from kafka import TopicPartition
            from kafka.structs import OffsetAndMetadata

            call_with_deadline(
                functools.partial(
                    self.kp.send_offsets_to_transaction,
                    {TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)},
                    group,
                ),
                CALL_TIMEOUT,
                "send_offsets_to_transaction",
            )

    def commit(self) -> None:
        if self.client == "confluent-kafka":
            self.ck.commit_transaction(CALL_TIMEOUT)
        else:
            call_with_deadline(self.kp.commit_transaction, CALL_TIMEOUT, "commit_transaction")

    def concurrent_seen(self) -> list[str]:
        if self.rdkafka_log is not None:
            self.ck.poll(0)  # serve queued log lines
            return self.rdkafka_log.concurrent()
        assert self.kp_log is not None
        return self.kp_log.concurrent()

    def close(self) -> None:
        try:
            if self.client == "confluent-kafka":
                self.ck.flush(1)
            else:
                self.kp.close(timeout=2)
        finally:
            self._kp_attached.close()


def _error_class(exc: BaseException) -> str:
    """The client's error class: librdkafka's error name, else the exception type (and the
    Kafka error it wraps)."""
    if isinstance(exc, SystemError) and isinstance(exc.__cause__, ck.KafkaException):
        # confluent-kafka raises a fatal error from inside flush(); the delivery callback
        # that runs next turns it into "SystemError: ... returned a result with an exception
        # set", caused by the client's real error.
        exc = exc.__cause__
    if isinstance(exc, ck.KafkaException) and exc.args and isinstance(exc.args[0], ck.KafkaError):
        err = exc.args[0]
        return f"KafkaError.{err.name()}{' (fatal)' if err.fatal() else ''}"
    wrapped = re.search(r"\[Error \d+\] (\w+)", str(exc))
    name = type(exc).__name__
    return name + (f"({wrapped.group(1)})" if wrapped and wrapped.group(1) != name else "")


@dataclass
class FenceOutcome:
    errors: list[tuple[str, str]]  # (step, error class) of the fenced producer
    committed: list[bytes]
    aborted: list[bytes]
    still_open: list[bytes]


def fence_scenario(client: str, bootstrap: str, topic: str, txn_id: str) -> FenceOutcome:
    """A producer commits a transaction; a second one with the same transactional id starts
    (InitProducerId bumps the epoch); the first tries another transaction and commits; the
    second commits one."""
    first = TxnClient(client, bootstrap, txn_id)
    second: TxnClient | None = None
    errors: list[tuple[str, str]] = []
    try:
        first.init()
        first.produce_in_transaction(topic, [(0, b"first-committed")])
        first.commit()
        second = TxnClient(client, bootstrap, txn_id)
        second.init()
        steps: list[tuple[str, Callable[[], None]]] = [
            ("produce", lambda: first.produce_in_transaction(topic, [(1, b"first-fenced")])),
            ("commit", first.commit),
        ]
        for step, action in steps:
            try:
                action()
            except Exception as exc:
                errors.append((step, _error_class(exc)))
        second.produce_in_transaction(topic, [(2, b"second-committed")])
        second.commit()
    finally:
        if second is not None:  # closed in reverse: each restores the logger it found
            second.close()
        first.close()
    logs = [resolve(read_log(bootstrap, topic, p)) for p in range(3)]
    return FenceOutcome(
        errors,
        [v for log in logs for v in log.committed],
        [v for log in logs for v in log.aborted],
        [v for log in logs for v in log.still_open],
    )


FENCING_ERRORS = {
    "confluent-kafka": "KafkaError._FENCED (fatal)",
    "kafka-python": "ProducerFencedError",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_fencing_matches_direct(
    client: str, make_stack: StackFactory, request: pytest.FixtureRequest
) -> None:
    """A second producer with the same transactional id fences the first through kipside
    exactly as it does directly against the broker: the same error class at the same step,
    the fenced producer's record never committed, the new producer's transaction commits."""
    topic = unique_name("fence", request)
    stack = make_stack(rules_yaml("fence-*", [Output(topic)], unique_name("g"), HOLD_MAX_MS))
    create_topics(stack.bootstrap, [topic], 3)
    via = fence_scenario(client, stack.bootstrap, topic, unique_name("fence"))
    stack.kipside.assert_alive()
    warnings = assert_no_kipside_errors(stack.kipside)
    assert not stack.relay.problems(), stack.relay.problems()

    with start_tansu() as broker:
        create_topics(broker.bootstrap, [topic], 3)
        direct = fence_scenario(client, broker.bootstrap, topic, unique_name("fence"))

    assert direct.errors, "the broker did not fence the first producer (without kipside)"
    assert direct.errors[0][1] == FENCING_ERRORS[client], direct.errors
    assert via.errors == direct.errors, f"via kipside {via.errors}, direct {direct.errors}"
    for outcome in (via, direct):
        assert outcome.committed == [b"first-committed", b"second-committed"], outcome
        assert not outcome.still_open, outcome
    assert via.aborted == direct.aborted
    print(
        f"\n[{client}] fenced producer: via kipside {via.errors}; direct {direct.errors}; "
        f"kipside warnings: {warnings}"
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_hold_timeout_returns_concurrent_transactions(
    client: str, make_stack: StackFactory, request: pytest.FixtureRequest
) -> None:
    """hold_begin.max_ms = 100 against a 2 s marker window: kipside stops holding after
    ~100 ms and gives the client the real CONCURRENT_TRANSACTIONS, which the client then
    handles itself (librdkafka and kafka-python retry the add after their own backoff, so the
    transaction still commits once the window is over)."""
    topic, group = unique_name("hold", request), unique_name("g", request)
    rules = rules_yaml("hold-*", [Output(topic)], group, TIMEOUT_HOLD_MAX_MS)
    stack = make_stack(rules, window_ms=TIMEOUT_WINDOW_MS)
    create_topics(stack.bootstrap, [topic], OUT_PARTITIONS)
    txn_id = unique_name("hold")
    producer = TxnClient(client, stack.bootstrap, txn_id)
    try:
        producer.init()
        producer.produce_in_transaction(topic, [(p, b"t1") for p in range(OUT_PARTITIONS)])
        producer.commit()  # the window opens
        assert not producer.concurrent_seen()
        started = time.monotonic()
        producer.produce_in_transaction(topic, [(p, b"t2") for p in range(OUT_PARTITIONS)])
        waited = time.monotonic() - started
        producer.commit()
        seen = producer.concurrent_seen()
    finally:
        producer.close()
    stack.kipside.assert_alive()
    assert_no_kipside_errors(stack.kipside)
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    counts = relay.counts()

    # kipside returned the real error many times within the window: its holds were short.
    assert len(seen) >= 3, f"{client} saw CONCURRENT_TRANSACTIONS {len(seen)} times"
    assert counts.rejected_add_partitions >= len(seen)
    # The client's own retries, not kipside, waited the window out.
    assert waited >= TIMEOUT_WINDOW_MS / 1000 * 0.5, f"the second transaction began in {waited}"
    ended = [s for s in relay.segments(txn_id) if s.end is not None]
    commits = sum(1 for s in ended if s.end and s.end.committed)
    # kipside ends a transaction it opened that the client thinks failed (its registration of
    # the declared group may succeed in the very attempt where the client's partitions get
    # the error): those aborts are kipside's, each logged.
    orphans = stack.kipside.log().count("kipside aborted that transaction")
    assert (commits, len(ended) - commits) == (2, orphans), ended
    log = [resolve(read_log(stack.bootstrap, topic, p)) for p in range(OUT_PARTITIONS)]
    assert all(x.committed == [b"t1", b"t2"] and not x.still_open for x in log), log
    print(
        f"\n[{client}] hold max {TIMEOUT_HOLD_MAX_MS} ms vs window {TIMEOUT_WINDOW_MS:.0f} ms: "
        f"client saw CONCURRENT_TRANSACTIONS {len(seen)} times ({Counter(seen)}) while the "
        f"relay rejected {counts.rejected_add_partitions} AddPartitionsToTxn + "
        f"{counts.rejected_add_offsets} AddOffsetsToTxn; second transaction's add took "
        f"{waited:.2f} s; accepted upstream adds per transaction "
        f"{[(s.accepted_add_partitions, s.accepted_add_offsets) for s in ended]}; "
        f"kipside orphan aborts: {orphans}"
    )


def test_missing_declared_output_topic(
    make_stack: StackFactory, request: pytest.FixtureRequest
) -> None:
    """A rule declaring outputs that don't exist (one "all partitions", one with explicit
    partitions, which the relay refuses the way Apache Kafka refuses unknown topics in
    AddPartitionsToTxn) doesn't break the client's transactions: every commit succeeds, the
    records are committed, and kipside logs each rule problem once."""
    topic, group = unique_name("real", request), unique_name("g", request)
    missing_all = unique_name("missing-all", request)
    missing_some = unique_name("missing-some", request)
    outputs = [Output(topic), Output(missing_all), Output(missing_some, (0, 1))]
    stack = make_stack(rules_yaml("miss-*", outputs, group, HOLD_MAX_MS))
    stack.relay.unknown_topics = frozenset({missing_all, missing_some})
    create_topics(stack.bootstrap, [topic], OUT_PARTITIONS)
    txn_id = unique_name("miss")
    producer = TxnClient("confluent-kafka", stack.bootstrap, txn_id)
    transactions = 5
    try:
        producer.init()
        for i in range(transactions):
            # Partition 0 first, the rest once it is registered: the second AddPartitionsToTxn
            # is covered by pre-registration only if kipside kept the valid declared outputs.
            value = f"t{i}".encode()
            producer.produce_in_transaction(topic, [(0, value)])
            values = [(p, value) for p in range(1, OUT_PARTITIONS)]
            producer.produce_in_transaction(topic, values, begin=False)
            producer.send_offsets(topic, i + 1, group)
            producer.commit()
        seen = producer.concurrent_seen()
        assert producer.rdkafka_log is not None
        failed_adds = [ln for ln in producer.rdkafka_log.lines if "Failed to add" in ln]
    finally:
        producer.close()
    stack.kipside.assert_alive()
    assert_no_kipside_errors(stack.kipside)
    assert not seen and not failed_adds, (seen, failed_adds)
    log = [resolve(read_log(stack.bootstrap, topic, p)) for p in range(OUT_PARTITIONS)]
    want = [f"t{i}".encode() for i in range(transactions)]
    assert all(x.committed == want and not x.still_open for x in log), log

    kipside_log = stack.kipside.log()
    about_all = [ln for ln in kipside_log.splitlines() if repr(missing_all) in ln]
    about_some = [ln for ln in kipside_log.splitlines() if missing_some in ln]
    assert len(about_all) == 1 and "does not know" in about_all[0], about_all
    assert len(about_some) == 1 and "refused" in about_some[0], about_some
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    ended = [s for s in relay.segments(txn_id) if s.end is not None]
    assert len(ended) == transactions
    # The first transaction learns of the refusal (one refused, one accepted add); later ones
    # skip the refused outputs and keep the valid ones: one accepted add each, none refused.
    per_txn = [(s.accepted_add_partitions, s.refused_add_partitions) for s in ended]
    assert per_txn == [(1, 1)] + [(1, 0)] * (transactions - 1), per_txn
    admin_names = AdminClient(ck_config(stack.bootstrap)).list_topics(timeout=10).topics
    assert missing_all not in admin_names and missing_some not in admin_names
    print(
        f"\n[missing outputs] per transaction (accepted, refused) AddPartitionsToTxn upstream: "
        f"{[(s.accepted_add_partitions, s.refused_add_partitions) for s in ended]}; "
        f"kipside log: {about_all + about_some}"
    )


# --------------------------------------------------------------------------- what the hold costs


COST_WINDOW_MS = 100.0  # long enough for several of librdkafka's 20 ms retries
COST_TRANSACTIONS = 8
COST_PARTITIONS = 4


def _tight_loop(bootstrap: str, txn_id: str, topic: str, group: str) -> list[str]:
    """librdkafka's transactions back to back, as bench/_txn_load.py runs them: begin, produce
    to every partition, send the offsets at once (its AddOffsetsToTxn goes while the adds
    are still refused), commit; returns the CONCURRENT_TRANSACTIONS answers it saw."""
    client = TxnClient("confluent-kafka", bootstrap, txn_id)
    consumer = ck_consumer(bootstrap, group)
    try:
        metadata = consumer.consumer_group_metadata()
        client.init()
        for i in range(COST_TRANSACTIONS):
            client.ck.begin_transaction()
            for partition in range(COST_PARTITIONS):
                client.ck.produce(topic, value=f"{txn_id}-{i}".encode(), partition=partition)
            offsets = [ck.TopicPartition(topic, 0, i + 1)]
            client.ck.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT)
            client.commit()
        return client.concurrent_seen()
    finally:
        consumer.close()
        client.close()


def test_the_hold_costs_the_coordinator_no_more_than_the_client_alone(
    make_stack: StackFactory, request: pytest.FixtureRequest
) -> None:
    """The same relay and marker window (100 ms after every EndTxn), the same loop of
    transactions by librdkafka: once straight through the relay, once through kipside (the
    rule declares the output topic and the group). The CONCURRENT_TRANSACTIONS answers the
    relay gave in the windows through kipside (its begin hold's probes) are no more than it
    gave librdkafka's own retries of AddPartitionsToTxn and AddOffsetsToTxn, and the client
    behind kipside saw none of them."""
    topic, group = unique_name("cost", request), unique_name("g", request)
    stack = make_stack(
        rules_yaml("cost-via-*", [Output(topic)], group, HOLD_MAX_MS), window_ms=COST_WINDOW_MS
    )
    create_topics(stack.bootstrap, [topic], COST_PARTITIONS)
    direct_id, via_id = unique_name("cost-direct"), unique_name("cost-via")
    direct_seen = _tight_loop(stack.broker.bootstrap, direct_id, topic, group)  # the relay's
    via_seen = _tight_loop(stack.bootstrap, via_id, topic, group)
    stack.kipside.assert_alive()
    assert_no_kipside_errors(stack.kipside)
    relay = stack.relay
    assert not relay.problems(), relay.problems()

    def refused(txn_id: str) -> list[tuple[int, int]]:
        """Per transaction after the first (which follows no window): the relay's
        CONCURRENT_TRANSACTIONS answers to AddPartitionsToTxn and to AddOffsetsToTxn."""
        ended = [s for s in relay.segments(txn_id) if s.end is not None]
        assert len(ended) == COST_TRANSACTIONS, ended
        return [(s.rejected_add_partitions, s.rejected_add_offsets) for s in ended[1:]]

    direct, via = refused(direct_id), refused(via_id)
    direct_total, via_total = sum(map(sum, direct)), sum(map(sum, via))
    print(
        f"\n[hold cost] window {COST_WINDOW_MS:.0f} ms, {COST_TRANSACTIONS - 1} transactions "
        f"after one: CONCURRENT_TRANSACTIONS (AddPartitionsToTxn, AddOffsetsToTxn) per "
        f"transaction direct {direct} = {direct_total}, through kipside {via} = {via_total}; "
        f"seen by the client: direct {len(direct_seen)}, through kipside {len(via_seen)}"
    )
    assert direct_total >= COST_TRANSACTIONS - 1, "the window was not hit directly"
    assert via_total > 0, "kipside never met the window"
    assert via_total <= direct_total
    assert direct_seen and not via_seen
    # Both loops' transactions committed, each record once, in order, none left open.
    for partition in range(COST_PARTITIONS):
        log = resolve(read_log(stack.bootstrap, topic, partition))
        want = [f"{i}-{n}".encode() for i in (direct_id, via_id) for n in range(COST_TRANSACTIONS)]
        assert (log.committed, log.aborted, log.still_open) == (want, [], []), partition


# --------------------------------------------------------------------------- the relay itself


def _request(api_key: int, version: int, correlation_id: int, message: Any) -> bytes:
    header = encode_request_header(api_key, version, correlation_id, "kipside-it-relay")
    return build_frame(header, encode_message(message))


def _add_partitions_request(version: int, txn_id: str, topics: dict[str, list[int]]) -> Any:
    cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, version)
    topic_cls = typing.get_args(typing.get_type_hints(cls)["v3_and_below_topics"])[0]
    return cls(
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=i64(1),
        v3_and_below_producer_epoch=i16(0),
        v3_and_below_topics=tuple(
            topic_cls(name=name, partitions=tuple(i32(p) for p in ps))
            for name, ps in topics.items()
        ),
    )


def _partition_codes(frame: bytes, version: int) -> list[tuple[str, int, int]]:
    header = parse_response_header(frame, ApiKey.ADD_PARTITIONS_TO_TXN, version)
    response = decode_response(ApiKey.ADD_PARTITIONS_TO_TXN, version, frame, header.body_offset)
    return [
        (str(t.name), int(p.partition_index), int(p.partition_error_code))
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    ]


def test_relay_answers_in_order_with_right_headers(request: pytest.FixtureRequest) -> None:
    """MarkerWindowRelay, on its own in front of Tansu (raw socket, no kipside): a local answer
    waits behind a response the broker still owes on the same connection; AddPartitionsToTxn
    v0 and v3 (flexible) rejections list exactly the requested partitions with error 51 under
    the request's correlation id and header version; AddOffsetsToTxn gets 51; outside the
    window requests are forwarded; unknown_topics are refused the Apache Kafka way."""
    relay = MarkerWindowRelay(window_ms=50)
    with tansu_behind(relay):
        topic = unique_name("relay", request)
        create_topics(relay.bootstrap, [topic], 3)
        txn_id = unique_name("relay-self")
        relay.open_window(txn_id, 5000)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
            # A Fetch the broker parks (empty partition, min_bytes 1, max_wait 400 ms), then
            # three requests the relay answers itself, written together.
            name = topic.encode()
            fetch = struct.pack(">iiiib", -1, 400, 1, 1 << 20, 0) + struct.pack(">ih", 1, len(name))
            fetch += name + struct.pack(">iiqi", 1, 0, 0, 1 << 20)
            header = encode_request_header(ApiKey.FETCH, 4, 100, "kipside-it-relay")
            offsets_cls = request_class(ApiKey.ADD_OFFSETS_TO_TXN, 0)
            add_offsets = offsets_cls(
                transactional_id=txn_id, producer_id=i64(1), producer_epoch=i16(0), group_id="g"
            )
            wanted = {topic: [2, 0, 1], "other": [7]}
            sent = time.monotonic()
            sock.sendall(
                build_frame(header, fetch)
                + _request(
                    ApiKey.ADD_PARTITIONS_TO_TXN, 0, 101, _add_partitions_request(0, txn_id, wanted)
                )
                + _request(
                    ApiKey.ADD_PARTITIONS_TO_TXN, 3, -7, _add_partitions_request(3, txn_id, wanted)
                )
                + _request(ApiKey.ADD_OFFSETS_TO_TXN, 0, 103, add_offsets)
            )
            frames = [read_frame(sock) for _ in range(4)]
            fetch_seconds = time.monotonic() - sent
            assert [response_correlation_id(f) for f in frames] == [100, 101, -7, 103]
            want = [(t, p, CONCURRENT_TRANSACTIONS) for t, ps in wanted.items() for p in ps]
            assert _partition_codes(frames[1], 0) == want
            assert _partition_codes(frames[2], 3) == want  # response header v1 for v3
            offsets_header = parse_response_header(frames[3], ApiKey.ADD_OFFSETS_TO_TXN, 0)
            answer = decode_response(
                ApiKey.ADD_OFFSETS_TO_TXN, 0, frames[3], offsets_header.body_offset
            )
            assert int(answer.error_code) == CONCURRENT_TRANSACTIONS

            # Outside any window: forwarded; unknown topics refused by the relay.
            other_id = unique_name("relay-other")
            relay.unknown_topics = frozenset({"other"})
            sock.sendall(
                _request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    3,
                    104,
                    _add_partitions_request(3, other_id, wanted),
                )
            )
            refused = _partition_codes(read_frame(sock), 3)
            assert refused == [(topic, p, 55) for p in wanted[topic]] + [("other", 7, 3)]
            relay.unknown_topics = frozenset()
            sock.sendall(
                _request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    3,
                    105,
                    _add_partitions_request(3, other_id, {topic: [0]}),
                )
            )
            forwarded = read_frame(sock)
            assert response_correlation_id(forwarded) == 105
            _partition_codes(forwarded, 3)  # the broker's answer decodes

            # delay_ms: each direction is delayed, local answers included (a simulated RTT).
            relay.delay_ms = 30.0
            relay.open_window(other_id, 5000)
            round_trips = []
            for correlation_id, frame in (
                (106, build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 106, None), b"")),
                (
                    107,
                    _request(
                        ApiKey.ADD_PARTITIONS_TO_TXN,
                        3,
                        107,
                        _add_partitions_request(3, other_id, {topic: [0]}),
                    ),
                ),
            ):
                sent = time.monotonic()
                sock.sendall(frame)
                assert response_correlation_id(read_frame(sock)) == correlation_id
                round_trips.append(time.monotonic() - sent)
            assert min(round_trips) >= 0.055, round_trips
            relay.delay_ms = 0.0
        counts = relay.counts()
        assert (
            counts.rejected_add_partitions,
            counts.rejected_add_offsets,
            counts.refused_add_partitions,
            counts.accepted_add_partitions,
        ) == (3, 1, 1, 1)
        assert counts.forwarded[ApiKey.FETCH] == 1 and counts.local_answers == 5
        assert not relay.problems(), relay.problems()
        print(
            f"\n[relay] parked Fetch answered after {fetch_seconds:.3f} s, local answers after "
            f"it; round trips with delay_ms=30: {[round(t, 3) for t in round_trips]}"
        )
