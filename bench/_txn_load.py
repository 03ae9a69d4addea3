"""A transactional consume-transform-produce client for bench/txn.py: `_txn_load.py 'JSON'`.

Arguments: client ("confluent-kafka" or "kafka-python"), bootstrap, transactional_id, warmup
(transactions before the clock starts), transactions and seconds (the most measured), deadline
(s, the whole run). Set-up (confluent-kafka, whatever the client under test): the output topic
(8 partitions), a one-partition input topic and its records. The loop, per transaction: read
the next input record (an assigned consumer), begin, produce one record to every output
partition, send the input offset to the transaction for the group, commit.

Prints one JSON object: each measured transaction's latency (begin called -> commit returned),
the measured window on the system-wide monotonic clock (so the parent can pick the relay's
events of exactly these transactions), and the CONCURRENT_TRANSACTIONS answers the client
itself received, from its own logs: librdkafka's `eos` debug lines naming the error (an
AddOffsetsToTxn answer is logged twice, the "Failed to add offsets" line is not counted; an
AddPartitionsToTxn answer once per partition), kafka-python's TransactionManager DEBUG records
of the decoded responses. Free of project imports; the loop runs in a thread the main thread
joins with the deadline, so no client call can hang the run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

IN, OUT, GROUP, PARTITIONS, CALL_TIMEOUT = (
    "bench-txn-in",
    "bench-txn-out",
    "bench-txn-group",
    8,
    20.0,
)
CONCURRENT_TRANSACTIONS = 51
RDKAFKA_CONCURRENT = re.compile(
    r"CONCURRENT_TRANSACTIONS|another concurrent operation on the same transaction"
)


def set_up(a: dict[str, Any]) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
    wanted = {OUT: PARTITIONS, IN: 1}
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in wanted.items()]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while not all(
        len(t.partitions) == wanted.get(n)
        for n, t in admin.list_topics(timeout=10).topics.items()
        if n in wanted
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {sorted(wanted)} did not all appear in metadata")
        time.sleep(0.05)
    p = Producer({"bootstrap.servers": a["bootstrap"], "linger.ms": 5})
    for i in range(int(a["transactions"]) + int(a["warmup"]) + 10):
        p.produce(IN, f"in-{i:05d}".encode(), partition=0)
    if p.flush(30) != 0:
        raise RuntimeError("input records not delivered in 30 s")


class Loop:
    """The plan (warm-up, then measured transactions) and what it measured."""

    def __init__(self, a: dict[str, Any], concurrent: Callable[[], int]) -> None:
        self.a, self.concurrent = a, concurrent
        self.latencies_ms: list[float] = []
        self.start = self.end = self.began = 0.0
        self.warmup_concurrent, self.capped = 0, False

    def __iter__(self) -> Iterator[int]:
        warmup = int(self.a["warmup"])
        for i in range(warmup + int(self.a["transactions"])):
            if i == warmup:
                self.warmup_concurrent, self.start = self.concurrent(), time.monotonic()
            elif i > warmup and time.monotonic() - self.start > float(self.a["seconds"]):
                self.capped = True
                return
            yield i
            if i >= warmup:
                self.end = time.monotonic()
                self.latencies_ms.append((self.end - self.began) * 1000)

    def begin(self) -> None:
        """The transaction begins now (its input record is read)."""
        self.began = time.monotonic()

    def result(self) -> dict[str, Any]:
        n, elapsed = len(self.latencies_ms), self.end - self.start
        return {
            "transactions": n,
            "txn_per_s": n / elapsed if elapsed > 0 else 0.0,
            "latencies_ms": self.latencies_ms,
            "start": self.start,
            "end": self.end,
            "time_capped": self.capped,
            "warmup_concurrent": self.warmup_concurrent,
            "client_concurrent": self.concurrent() - self.warmup_concurrent,
        }


def output(i: int, value: bytes, partition: int) -> bytes:
    return value + f"|t{i:05d}|p{partition}".encode()


def run_confluent(a: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    lines: list[str] = []
    logger = logging.getLogger("bench-txn.rdkafka")
    logger.addHandler(Lines(lines, lambda r: r.getMessage()))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    producer = Producer(
        {
            "bootstrap.servers": a["bootstrap"],
            "transactional.id": a["transactional_id"],
            "linger.ms": 1,
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 15000,
            "debug": "eos",
            "logger": logger,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": a["bootstrap"],
            "group.id": GROUP,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )

    def concurrent() -> int:
        producer.poll(0)  # serves the queued log lines
        return sum(
            1 for ln in lines if RDKAFKA_CONCURRENT.search(ln) and "Failed to add offsets" not in ln
        )

    loop = Loop(a, concurrent)
    consumer.assign([TopicPartition(IN, 0, 0)])
    producer.init_transactions(CALL_TIMEOUT)
    for i in loop:
        message = None
        while message is None or message.offset() != i:
            message = consumer.poll(CALL_TIMEOUT)
            if message is None or message.error() is not None:
                raise RuntimeError(f"input record {i}: {message and message.error()}")
        loop.begin()
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(OUT, output(i, message.value() or b"", p), partition=p)
        offsets = [TopicPartition(IN, 0, i + 1)]
        producer.send_offsets_to_transaction(
            offsets, consumer.consumer_group_metadata(), CALL_TIMEOUT
        )
        producer.commit_transaction(CALL_TIMEOUT)
    consumer.close()
    return loop.result()


class Lines(logging.Handler):
    """Keeps what `pick` takes of each log record."""

    def __init__(self, into: list[Any], pick: Callable[[logging.LogRecord], Any]) -> None:
        super().__init__(logging.DEBUG)
        self.into, self.pick = into, pick

    def emit(self, record: logging.LogRecord) -> None:
        if (kept := self.pick(record)) is not None:
            self.into.append(kept)


def codes(response: Any) -> set[int]:
    found = (
        {response.error_code} if isinstance(getattr(response, "error_code", None), int) else set()
    )
    for topic in getattr(response, "results_by_topic_v3_and_below", None) or ():
        found |= {int(p.partition_error_code) for p in topic.results_by_partition}
    return found


def run_kafka_python(a: dict[str, Any]) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    responses: list[Any] = []
    logger = logging.getLogger("kafka.producer.transaction_manager")
    answered = "Received transactional response"
    logger.addHandler(
        Lines(
            responses,
            lambda r: (
                r.args[0] if str(r.msg).startswith(answered) and isinstance(r.args, tuple) else None
            ),
        )
    )
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    common = {
        "bootstrap_servers": a["bootstrap"],
        "request_timeout_ms": 30000,
        "reconnect_backoff_max_ms": 500,
    }
    producer = KafkaProducer(
        **common,
        transactional_id=a["transactional_id"],
        linger_ms=1,
        acks="all",
        max_block_ms=10000,
        transaction_timeout_ms=60000,
    )
    # group_id None: kafka-python's group consume returns nothing on Tansu
    consumer = KafkaConsumer(
        **common,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        isolation_level="read_committed",
    )
    tp, pending = TopicPartition(IN, 0), list[Any]()
    consumer.assign([tp])
    consumer.seek(tp, 0)
    producer.init_transactions()
    loop = Loop(a, lambda: sum(CONCURRENT_TRANSACTIONS in codes(r) for r in list(responses)))
    for i in loop:
        deadline = time.monotonic() + CALL_TIMEOUT
        while not pending or pending[0].offset != i:
            if pending:
                pending.pop(0)
            elif time.monotonic() > deadline:
                raise RuntimeError(f"input record at offset {i} never arrived")
            else:
                pending += [
                    r for rs in consumer.poll(timeout_ms=200, max_records=500).values() for r in rs
                ]
        value = bytes(pending.pop(0).value)
        loop.begin()
        producer.begin_transaction()
        sent = [
            producer.send(OUT, value=output(i, value, p), partition=p) for p in range(PARTITIONS)
        ]
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(i + 1, "", -1)}, GROUP)
        producer.commit_transaction()
        for future in sent:
            future.get(timeout=1)
    consumer.close(autocommit=False)
    producer.close(timeout=5)
    return loop.result()


CLIENTS = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python}

if __name__ == "__main__":
    a: dict[str, Any] = json.loads(sys.argv[1])
    box: list[dict[str, Any]] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            set_up(a)
            box.append(CLIENTS[a["client"]](a))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(float(a["deadline"]))
    if thread.is_alive():
        print(f"the run did not finish within {a['deadline']} s", file=sys.stderr, flush=True)
        os._exit(3)  # the loop thread is stuck in a client call: don't wait for it
    if failure:
        raise failure[0]
    print(json.dumps(box[0]), flush=True)
