"""The scenarios' clients, each a thread (a `Load`) that keeps what it was told: idempotent and
at-least-once producers of NAME|P|SEQ values, a transactional writer, consumer-group members."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka as ck

RUN_TIMEOUT = 60.0  # any one scenario's traffic, whatever happens


class Load(threading.Thread):
    """A client load in a thread: stop() ends it; `run_timeout` (seconds) ends it whatever
    happens (longer for bench/soak.py); `error` is what it raised."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.run_timeout = RUN_TIMEOUT
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        raise NotImplementedError


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def value_of(name: str, partition: int, seq: int) -> bytes:
    return f"{name}|{partition}|{seq:07d}".encode()


def parse_value(value: bytes) -> tuple[str, int, int]:
    name, partition, seq = value.decode().split("|")
    return name, int(partition), int(seq)


@dataclass
class Delivered:
    """What one producer was told: acknowledged values, and failures with their error."""

    acked: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    sent: int = 0


def client_conf(bootstrap: str, name: str, **extra: Any) -> dict[str, Any]:
    """What every confluent-kafka client of a scenario sets: quick reconnects (the outages are
    seconds long) and quiet about disconnects."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": name,
        "socket.connection.setup.timeout.ms": 5000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        # The disconnects are the scenario's own faults: logged, hundreds of them buried the
        # failed check in CI's excerpt of a failing run.
        "log.connection.close": False,
        **extra,
    }


def producer_conf(bootstrap: str, name: str, **extra: Any) -> dict[str, Any]:
    """A scenario's producer: retries quickly and outlasts any outage a scenario injects."""
    return client_conf(
        bootstrap,
        name,
        **{
            "linger.ms": 5,
            # Longer than any outage a scenario injects: a transactional message that times out
            # makes librdkafka bump its epoch (KIP-360 InitProducerId with its producer id),
            # which Tansu 0.6.0 answers UNKNOWN_SERVER_ERROR for ever (seen without kipside).
            "message.timeout.ms": 45000,
            "retry.backoff.ms": 50,
            "compression.type": "none",  # the audit reads record batches by hand
            **extra,
        },
    )


def idempotent_conf(bootstrap: str, name: str, **extra: Any) -> dict[str, Any]:
    return producer_conf(bootstrap, name, **{"enable.idempotence": True, **extra})


class SequencedProducer(Load):
    """A confluent-kafka producer writing NAME|P|SEQ round-robin over `partitions` of `topic`
    at about `rate` messages a second until stop() (then it flushes), or until `count` are
    sent. What it was told is in `delivered` once joined; `latencies` are per-message delivery
    latencies (seconds) with the time each was sent."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float = 200.0,
        count: int | None = None,
        flush_timeout: float = 50.0,
        **conf: Any,
    ) -> None:
        super().__init__(name)
        self.topic, self.partitions, self.rate, self.count = topic, partitions, rate, count
        self.flush_timeout = flush_timeout
        self.conf = idempotent_conf(bootstrap, name, **conf)
        self.delivered = Delivered()
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds to the ack)
        self.unflushed = 0

    def _run(self) -> None:
        producer = ck.Producer(self.conf)
        delivered, latencies = self.delivered, self.latencies
        seqs = [0] * self.partitions
        started = time.monotonic()
        deadline = started + self.run_timeout

        def report(sent_at: float) -> Callable[[Any, Any], None]:
            def on_delivery(err: Any, msg: Any) -> None:
                if err is None:
                    delivered.acked.append(msg.value())
                    latencies.append((sent_at, time.monotonic() - sent_at))
                else:
                    delivered.failed.append((msg.value(), str(err)))

            return on_delivery

        while not self._stop_event.is_set() and time.monotonic() < deadline:
            if self.count is not None and delivered.sent >= self.count:
                break
            p = delivered.sent % self.partitions
            value = value_of(self.name, p, seqs[p])
            try:
                now = time.monotonic()
                producer.produce(self.topic, value, partition=p, on_delivery=report(now))
            except BufferError:
                producer.poll(0.05)
                continue
            seqs[p] += 1
            delivered.sent += 1
            producer.poll(0)
            ahead = delivered.sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                producer.poll(ahead)
        self.unflushed = producer.flush(self.flush_timeout)


class KafkaPythonProducer(SequencedProducer):
    """The same load from kafka-python, at least once: acks=all and retries, no idempotence,
    one request in flight (so a retry cannot reorder; it may duplicate)."""

    def __init__(self, name: str, bootstrap: str, topic: str, partitions: int, rate: float):
        super().__init__(name, bootstrap, topic, partitions, rate)
        self.bootstrap = bootstrap

    def _run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.name,
            acks="all",
            enable_idempotence=False,
            retries=20,
            max_in_flight_requests_per_connection=1,
            request_timeout_ms=5000,
            retry_backoff_ms=100,
            reconnect_backoff_max_ms=500,
            linger_ms=5,
        )
        delivered = self.delivered
        seqs = [0] * self.partitions
        started = time.monotonic()
        deadline = started + self.run_timeout
        try:
            while not self._stop_event.is_set() and time.monotonic() < deadline:
                p = delivered.sent % self.partitions
                value = value_of(self.name, p, seqs[p])
                future = producer.send(self.topic, value, partition=p)
                future.add_callback(lambda _meta, v=value: delivered.acked.append(v))
                future.add_errback(lambda exc, v=value: delivered.failed.append((v, repr(exc))))
                seqs[p] += 1
                delivered.sent += 1
                ahead = delivered.sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            producer.flush(timeout=self.flush_timeout)
        finally:
            producer.close(timeout=5)
        self.unflushed = delivered.sent - len(delivered.acked) - len(delivered.failed)


def run_producers(producers: list[SequencedProducer], timeout: float = RUN_TIMEOUT) -> None:
    """Stop and join every producer; their own errors fail the test."""
    for p in producers:
        p.stop()
    for p in producers:
        p.join(timeout)
        assert not p.is_alive(), f"{p.name} did not finish in {timeout} s"
        assert p.error is None, f"{p.name} failed: {p.error!r}"


# --------------------------------------------------------------------------- transactions


class TransactionalLoop(Load):
    """A consume-transform-produce loop's writing half, with confluent-kafka: transaction i
    writes `per_txn` messages NAME|P|SEQ and commits offset i+1 of partition 0 of
    `input_topic` for `group`, one every `pause` seconds until stop() or `count` transactions.
    A transaction whose commit fails is aborted and done again (same messages), as an
    application must; a fatal error gets a new producer (init_transactions fences the old
    one). Only messages of transactions whose commit_transaction returned are acknowledged."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        topic: str,
        partitions: int,
        input_topic: str,
        group: str,
        per_txn: int = 10,
        count: int | None = None,
        pause: float = 0.02,
        **conf: Any,
    ) -> None:
        super().__init__(name)
        self.pause = pause
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.input_topic, self.group, self.per_txn, self.count = input_topic, group, per_txn, count
        self.conf = producer_conf(
            bootstrap,
            name,
            **{
                "transactional.id": name,
                "linger.ms": 2,
                "transaction.timeout.ms": 60000,
                # librdkafka 2.16 re-bootstraps when every broker connection is down, which
                # decommissions the cached group coordinator, and send_offsets_to_transaction
                # then hangs past its own timeout (confluentinc/librdkafka#5511, #5456; seen
                # without kipside too, through the relay alone): a client bug, kept out of the
                # scenarios.
                "metadata.recovery.strategy": "none",
                **conf,
            },
        )
        self.committed: list[bytes] = []  # acknowledged: their transaction committed
        self.transactions = 0
        self.aborted = 0
        self.errors: Counter[str] = Counter()  # what the client raised, by error name
        self.producers_made = 0
        self._seqs = [0] * partitions

    def _new_producer(self) -> ck.Producer:
        producer = ck.Producer(self.conf)
        self.producers_made += 1
        producer.init_transactions(30)
        return producer

    def _run(self) -> None:
        consumer = ck.Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name}
        )
        metadata = consumer.consumer_group_metadata()
        producer = self._new_producer()
        deadline = time.monotonic() + self.run_timeout
        try:
            while not self._stop_event.is_set() and time.monotonic() < deadline:
                if self.count is not None and self.transactions >= self.count:
                    break
                values = self._next_values()
                while not self._one(producer, values, metadata):
                    assert time.monotonic() < deadline, f"{self.name}: no commit in time"
                    if self._fatal:
                        producer = self._new_producer()
                self.transactions += 1
                self.committed.extend(values)
                self._stop_event.wait(self.pause)
        finally:
            consumer.close()

    def _next_values(self) -> list[bytes]:
        out = []
        for k in range(self.per_txn):
            p = k % self.partitions
            out.append(value_of(self.name, p, self._seqs[p]))
            self._seqs[p] += 1
        return out

    _fatal = False

    def _one(self, producer: ck.Producer, values: list[bytes], metadata: Any) -> bool:
        """One attempt at a transaction; True once committed."""
        self._fatal = False
        try:
            producer.begin_transaction()
            for value in values:
                _, p, _ = parse_value(value)
                producer.produce(self.topic, value, partition=p)
            offsets = [ck.TopicPartition(self.input_topic, 0, self.transactions + 1)]
            producer.send_offsets_to_transaction(offsets, metadata, 30)
            while True:
                try:
                    producer.commit_transaction(30)
                    return True
                except ck.KafkaException as exc:
                    if not exc.args[0].retriable():
                        raise
                    self.errors[f"commit: {exc.args[0].name()}"] += 1
        except ck.KafkaException as exc:
            err = exc.args[0]
            self.errors[err.name()] += 1
            if err.fatal():
                self._fatal = True
                return False
            self._abort(producer)
            return False

    def _abort(self, producer: ck.Producer) -> None:
        self.aborted += 1
        for _ in range(6):
            try:
                producer.abort_transaction(10)
                return
            except ck.KafkaException as exc:
                self.errors[f"abort: {exc.args[0].name()}"] += 1
                if exc.args[0].fatal():
                    self._fatal = True
                    return
                if not exc.args[0].retriable():
                    return
        raise AssertionError(f"{self.name}: abort_transaction never succeeded")


# --------------------------------------------------------------------------- consumer groups


def fill(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, int]:
    """Write `count` messages filler|P|SEQ round-robin; returns each partition's end offset."""
    producer = ck.Producer(idempotent_conf(bootstrap, "filler"))
    for i in range(count):
        p = i % partitions
        producer.produce(topic, value_of("filler", p, i // partitions), partition=p)
    assert producer.flush(30) == 0
    return {p: len(range(p, count, partitions)) for p in range(partitions)}


class GroupMember(Load):
    """A confluent-kafka consumer in `group`, at least once: it processes (records) each
    message, taking `work` seconds, and commits what it processed after every poll and when
    its partitions are revoked, synchronously. `processed` lists (partition, offset) in order;
    `rebalances` counts assignments; commit failures are counted, not raised (a commit lost to
    a fault means reprocessing, which at-least-once allows)."""

    def __init__(
        self, name: str, bootstrap: str, topic: str, group: str, work: float = 0.002
    ) -> None:
        super().__init__(name)
        self.topic, self.work = topic, work
        self.conf = client_conf(
            bootstrap,
            name,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 300,
                "fetch.wait.max.ms": 100,
            },
        )
        self.processed: list[tuple[int, int]] = []
        self.assignments = 0
        self.commit_failures: Counter[str] = Counter()
        self._uncommitted: dict[int, int] = {}

    def _commit(self, consumer: ck.Consumer) -> None:
        if not self._uncommitted:
            return
        offsets = [ck.TopicPartition(self.topic, p, o) for p, o in self._uncommitted.items()]
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:
            self.commit_failures[exc.args[0].name()] += 1
        self._uncommitted.clear()

    def _run(self) -> None:
        consumer = ck.Consumer(self.conf)

        def on_assign(c: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
            self.assignments += 1

        def on_revoke(c: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
            self._commit(c)

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        deadline = time.monotonic() + self.run_timeout
        try:
            while not self._stop_event.is_set() and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=20, timeout=0.1):
                    if message.error() is not None:
                        continue  # transport errors while the path is down: it retries
                    time.sleep(self.work)
                    p, offset = message.partition() or 0, message.offset() or 0
                    self.processed.append((p, offset))
                    self._uncommitted[p] = offset + 1
                self._commit(consumer)
        finally:
            self._commit(consumer)
            consumer.close()
