"""The consume-transform-produce loop of test_transactions_ctp.py, driven by any of the three
client libraries: read one input record, open a transaction, write it transformed to every
output partition and send the input offset (in either order), commit it, or abort it and read
the input again. One loop, `transact`, plays the plan; `ConfluentCtp`, `KafkaPythonCtp` and
`AiokafkaCtp` are the clients' own calls for each step (aiokafka's on an event loop of its
own, one step at a time).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import confluent_kafka as ck
from conftest import create_topics

from .clients import Msg, call_with_deadline
from .clients_aiokafka import aio_common
from .clients_confluent import ck_config, ck_consumer
from .clients_kafka_python import kp_common, kp_producer
from .txn_kit import (
    CALL_TIMEOUT,
    OUT_PARTITIONS,
    AiokafkaTxnLog,
    KafkaPythonTxnLog,
    RdkafkaLog,
    TxnStack,
)

INPUT_RECORDS = 40
ABORT_EVERY = 5  # attempts 0, 5, 10, ... are aborted: 40 inputs -> 50 transactions
TRANSACTIONS = INPUT_RECORDS * ABORT_EVERY // (ABORT_EVERY - 1)
CTP_DEADLINE = 100.0  # one whole consume-transform-produce run
OFFSET_CHECK_EVERY = 20  # commits between checks of the group's offset (every abort checks)


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

    def expected_outputs(self, committed: bool) -> list[Msg]:
        """The output records of the committed (or the aborted) attempts."""
        return [
            a.output(p)
            for a in self.attempts
            if a.committed == committed
            for p in range(OUT_PARTITIONS)
        ]


def plan(attempt: int) -> bool:
    """Commit (True) or abort (False) this attempt."""
    return attempt % ABORT_EVERY != 0


def ctp_topics(stack: TxnStack, run: CtpRun) -> None:
    """The output topic and the input topic with its INPUT_RECORDS records."""
    create_topics(stack.bootstrap, [run.output_topic], OUT_PARTITIONS)
    create_topics(stack.bootstrap, [run.input_topic], 1)
    p = ck.Producer(ck_config(stack.bootstrap, **{"linger.ms": 5}))
    for i in range(INPUT_RECORDS):
        p.produce(run.input_topic, value=f"in-{i:04d}".encode(), partition=0)
    assert p.flush(30) == 0


class OffsetChecker:
    """Reads the group's committed offset for the input partition (its own consumer)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = ck_consumer(bootstrap, group)
        self.topic = topic

    def committed(self) -> int:
        (tp,) = self.consumer.committed([ck.TopicPartition(self.topic, 0)], timeout=10)
        assert tp.error is None, tp.error
        return int(tp.offset)

    def check_after(self, run: CtpRun, expected: int) -> None:
        got = self.committed()
        if got == ck.OFFSET_INVALID and expected == 0:
            got = 0  # nothing committed yet
        run.committed_offsets_seen.append((expected, got))
        assert got == expected, (
            f"after attempt {len(run.attempts) - 1} the group's committed offset is {got}, "
            f"expected {expected}"
        )

    def close(self) -> None:
        self.consumer.close()


# --------------------------------------------------------------------------- the loop


class CtpClient(Protocol):
    """One client library's transactional producer and read_committed input consumer."""

    def next_input(self, position: int, deadline: float) -> bytes:
        """The input record at `position` (records fetched before a seek are skipped)."""
        ...

    def begin(self) -> None: ...

    def produce(self, attempt: Attempt) -> None:
        """The attempt's output to every partition, flushed; fails on any undelivered."""
        ...

    def send_offsets(self, offset: int) -> None: ...

    def commit(self) -> None: ...

    def abort_and_rewind(self, position: int) -> None:
        """Abort, and reprocess the input: back to the last committed position."""
        ...


def transact(run: CtpRun, client: CtpClient, checker: OffsetChecker) -> None:
    """Every input record committed once, the planned attempts aborted on the way; the
    group's offset checked after every abort and every OFFSET_CHECK_EVERY commits."""
    started = time.monotonic()
    deadline = started + CTP_DEADLINE
    position = 0
    while position < INPUT_RECORDS:
        assert time.monotonic() < deadline, f"{len(run.attempts)} transactions in time"
        value = client.next_input(position, deadline)
        attempt = Attempt(len(run.attempts), position, value, plan(len(run.attempts)))
        client.begin()
        for step in attempt.steps():
            if step == "produce":
                client.produce(attempt)
            else:
                client.send_offsets(position + 1)
        run.attempts.append(attempt)
        if attempt.committed:
            client.commit()
            position += 1
            if position % OFFSET_CHECK_EVERY == 0:
                checker.check_after(run, position)
        else:
            client.abort_and_rewind(position)
            checker.check_after(run, position)
    run.seconds = time.monotonic() - started


# --------------------------------------------------------------------------- the clients


class ConfluentCtp:
    def __init__(self, bootstrap: str, run: CtpRun, log_conf: dict[str, Any]) -> None:
        self.run = run
        self.errors: list[str] = []
        conf = {
            "transactional.id": run.txn_id,
            "linger.ms": 1,
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 15000,
            **log_conf,
        }
        self.producer = ck.Producer(ck_config(bootstrap, **conf))
        self.consumer = ck_consumer(bootstrap, run.group, **{"isolation.level": "read_committed"})

    def start(self) -> None:
        self.consumer.assign([ck.TopicPartition(self.run.input_topic, 0, 0)])
        self.group_metadata = self.consumer.consumer_group_metadata()
        self.producer.init_transactions(CALL_TIMEOUT)

    def next_input(self, position: int, deadline: float) -> bytes:
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            if message.offset() == position:
                value = message.value()
                assert value is not None, f"input record at offset {position} has no value"
                return value
        raise AssertionError(f"input record at offset {position} never arrived")

    def begin(self) -> None:
        self.producer.begin_transaction()

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def produce(self, attempt: Attempt) -> None:
        for partition in range(OUT_PARTITIONS):
            out = attempt.output(partition)
            self.producer.produce(
                self.run.output_topic,
                value=out.value,
                key=out.key,
                partition=partition,
                on_delivery=self._on_delivery,
            )
        assert self.producer.flush(CALL_TIMEOUT) == 0, "undelivered output"
        assert not self.errors, self.errors[:3]

    def send_offsets(self, offset: int) -> None:
        self.producer.send_offsets_to_transaction(
            [ck.TopicPartition(self.run.input_topic, 0, offset)], self.group_metadata, CALL_TIMEOUT
        )

    def commit(self) -> None:
        self.producer.commit_transaction(CALL_TIMEOUT)

    def abort_and_rewind(self, position: int) -> None:
        self.producer.abort_transaction(CALL_TIMEOUT)
        self.consumer.seek(ck.TopicPartition(self.run.input_topic, 0, position))


def run_ctp_confluent(stack: TxnStack, run: CtpRun) -> None:
    log = RdkafkaLog()
    client = ConfluentCtp(stack.bootstrap, run, log.conf())
    checker = OffsetChecker(stack.bootstrap, run.group, run.input_topic)
    try:
        client.start()
        transact(run, client, checker)
        client.producer.flush(5)  # serves the last log lines
    finally:
        client.consumer.close()
        checker.close()
    run.client_concurrent = log.concurrent()
    run.client_detail = f"{len(log.lines)} librdkafka eos log lines"


class KafkaPythonCtp:
    def __init__(self, bootstrap: str, run: CtpRun) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.run = run
        self.producer = kp_producer(
            bootstrap, transactional_id=run.txn_id, linger_ms=1, transaction_timeout_ms=60000
        )
        self.consumer = KafkaConsumer(
            **kp_common(bootstrap),
            group_id=None,  # kafka-python's group consume returns nothing on Tansu
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_poll_records=1,
            isolation_level="read_committed",
        )
        self.tp = TopicPartition(run.input_topic, 0)

    def start(self) -> None:
        self.consumer.assign([self.tp])
        self.consumer.seek(self.tp, 0)
        call_with_deadline(self.producer.init_transactions, CALL_TIMEOUT, "init_transactions")

    def next_input(self, position: int, deadline: float) -> bytes:
        while time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=200, max_records=1).values():
                for record in records:
                    if record.offset == position:
                        value: bytes = record.value
                        return value
                    self.consumer.seek(self.tp, position)  # a record from before the last seek
        raise AssertionError(f"input record at offset {position} never arrived")

    def begin(self) -> None:
        self.producer.begin_transaction()

    def produce(self, attempt: Attempt) -> None:
        futures = []
        for partition in range(OUT_PARTITIONS):
            out = attempt.output(partition)
            futures.append(
                self.producer.send(
                    self.run.output_topic, value=out.value, key=out.key, partition=partition
                )
            )
        self.producer.flush(timeout=CALL_TIMEOUT)
        for future in futures:
            future.get(timeout=1)

    def send_offsets(self, offset: int) -> None:
        from kafka.structs import OffsetAndMetadata

        call_with_deadline(
            functools.partial(
                self.producer.send_offsets_to_transaction,
                {self.tp: OffsetAndMetadata(offset, "", -1)},
                self.run.group,
            ),
            CALL_TIMEOUT,
            "send_offsets_to_transaction",
        )

    def commit(self) -> None:
        call_with_deadline(self.producer.commit_transaction, CALL_TIMEOUT, "commit_transaction")

    def abort_and_rewind(self, position: int) -> None:
        call_with_deadline(self.producer.abort_transaction, CALL_TIMEOUT, "abort_transaction")
        self.consumer.seek(self.tp, position)

    def close(self) -> None:
        self.consumer.close(autocommit=False)
        self.producer.close(timeout=5)


def run_ctp_kafka_python(stack: TxnStack, run: CtpRun) -> None:
    log = KafkaPythonTxnLog()
    _run_logged(stack, run, log, KafkaPythonCtp)
    run.client_detail = f"transactional responses: {dict(log.kinds())}"


class _StartedCtp(CtpClient, Protocol):
    def start(self) -> None: ...

    def close(self) -> None: ...


class _ClientLog(Protocol):
    def attached(self) -> AbstractContextManager[object]: ...

    def concurrent(self) -> list[str]: ...


def _run_logged(
    stack: TxnStack,
    run: CtpRun,
    log: _ClientLog,
    make: Callable[[str, CtpRun], _StartedCtp],
) -> None:
    """The loop with a client whose log is read while it runs (kafka-python, aiokafka)."""
    checker = OffsetChecker(stack.bootstrap, run.group, run.input_topic)
    with log.attached():
        client = make(stack.bootstrap, run)
        try:
            client.start()
            transact(run, client, checker)
        finally:
            client.close()
            checker.close()
    run.client_concurrent = log.concurrent()


class AiokafkaCtp:
    """aiokafka's producer and read_committed consumer, each step run to its end on the
    client's own event loop."""

    def __init__(self, bootstrap: str, run: CtpRun) -> None:
        self.run = run
        self.bootstrap = bootstrap
        self.loop = asyncio.new_event_loop()
        self.pending: list[Any] = []

    def _do(self, step: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(step, CALL_TIMEOUT))

    def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        async def start() -> None:
            common = aio_common(self.bootstrap)
            self.producer = AIOKafkaProducer(
                **common,
                transactional_id=self.run.txn_id,
                linger_ms=1,
                transaction_timeout_ms=60000,
            )
            self.consumer = AIOKafkaConsumer(
                **common,
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=100,
                isolation_level="read_committed",
            )
            await self.producer.start()  # InitProducerId
            await self.consumer.start()
            self.consumer.assign([self.tp])
            self.consumer.seek(self.tp, 0)

        self.tp = TopicPartition(self.run.input_topic, 0)
        self._do(start())

    def next_input(self, position: int, deadline: float) -> bytes:
        async def next_input() -> bytes:
            while time.monotonic() < deadline:
                record = await self.consumer.getone()
                if record.offset == position:
                    value: bytes = record.value
                    return value
                self.consumer.seek(self.tp, position)  # a record from before the last seek
            raise AssertionError(f"input record at offset {position} never arrived")

        return self._do(next_input())  # type: ignore[no-any-return]

    def begin(self) -> None:
        self._do(self.producer.begin_transaction())

    def produce(self, attempt: Attempt) -> None:
        async def produce() -> None:
            sent = []
            for partition in range(OUT_PARTITIONS):
                out = attempt.output(partition)
                sent.append(
                    await self.producer.send(
                        self.run.output_topic, value=out.value, key=out.key, partition=partition
                    )
                )
            await self.producer.flush()
            for future in sent:
                await future  # raises what the broker refused

        self._do(produce())

    def send_offsets(self, offset: int) -> None:
        self._do(self.producer.send_offsets_to_transaction({self.tp: offset}, self.run.group))

    def commit(self) -> None:
        self._do(self.producer.commit_transaction())

    def abort_and_rewind(self, position: int) -> None:
        self._do(self.producer.abort_transaction())
        self.consumer.seek(self.tp, position)

    def close(self) -> None:
        async def stop() -> None:
            await self.consumer.stop()
            await self.producer.stop()

        try:
            self._do(stop())
        finally:
            self.loop.close()


def run_ctp_aiokafka(stack: TxnStack, run: CtpRun) -> None:
    log = AiokafkaTxnLog()
    _run_logged(stack, run, log, AiokafkaCtp)
    run.client_detail = f"AddPartitionsToTxn/AddOffsetsToTxn answers: {len(log.codes)}"
