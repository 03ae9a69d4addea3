"""A transactional consume-transform-produce client for bench/txn.py: `_txn_load.py 'JSON'`.

Arguments: client ("confluent-kafka" or "kafka-python"), bootstrap, transactional_id, warmup,
transactions and seconds (the most measured). Per transaction:
read the next input record, begin, produce to every output partition, send the input offset
for the group, commit. Prints each measured transaction's latency (begin -> commit returned),
the measured window on the system-wide monotonic clock (to pick the relay's events), the
CONCURRENT_TRANSACTIONS answers the client received, from its own logs: librdkafka's `eos`
lines naming the error (not the second "Failed to add offsets" line of an AddOffsetsToTxn
answer), kafka-python's TransactionManager DEBUG records, and what a check found afterwards
(`checked`): the group's committed offset of the input partition, and the output read back
read_committed, each transaction's record in every partition counted. bench/txn.py kills a
run that hangs.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from _workload import create_topics

IN, OUT, GROUP = "bench-txn-in", "bench-txn-out", "bench-txn-group"
PARTITIONS, CALL_TIMEOUT = 8, 20.0
CONCURRENT_TRANSACTIONS = 51
RDKAFKA_CONCURRENT = re.compile(
    r"CONCURRENT_TRANSACTIONS|another concurrent operation on the same transaction"
)


def set_up(a: dict[str, Any]) -> None:
    """The output topic, a one-partition input topic and its records (with confluent-kafka)."""
    from confluent_kafka import Producer

    for topic, partitions in ((OUT, PARTITIONS), (IN, 1)):
        create_topics({"bootstrap": a["bootstrap"], "topics": [topic], "partitions": partitions})
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
        out: dict[str, Any] = {"transactions": n, "txn_per_s": n / elapsed if elapsed > 0 else 0.0}
        out |= {"latencies_ms": self.latencies_ms, "start": self.start, "end": self.end}
        out |= {"time_capped": self.capped, "warmup_concurrent": self.warmup_concurrent}
        out |= {"client_concurrent": self.concurrent() - self.warmup_concurrent}
        return out


def output(i: int, value: bytes, partition: int) -> bytes:
    return value + f"|t{i:05d}|p{partition}".encode()


def check(a: dict[str, Any], transactions: int) -> dict[str, int]:
    """After `transactions` committed ones (warm-up included): the group's committed offset of
    the input partition, and how many of the records they wrote a read_committed consumer
    reads exactly once, how many more than once, and how many it reads that none wrote."""
    from confluent_kafka import Consumer, TopicPartition

    common = {"bootstrap.servers": a["bootstrap"], "enable.auto.commit": False}
    group = Consumer({**common, "group.id": GROUP})
    (tp,) = group.committed([TopicPartition(IN, 0)], timeout=CALL_TIMEOUT)
    group.close()
    want = {
        output(i, f"in-{i:05d}".encode(), p) for i in range(transactions) for p in range(PARTITIONS)
    }
    reader = Consumer(
        {**common, "group.id": "bench-txn-check", "isolation.level": "read_committed"}
    )
    reader.assign([TopicPartition(OUT, p, 0) for p in range(PARTITIONS)])
    seen: dict[bytes, int] = {}
    deadline = time.monotonic() + CALL_TIMEOUT
    while sum(seen.values()) < len(want) and time.monotonic() < deadline:
        for m in reader.consume(500, 0.5):
            if m.error() is None:
                seen[m.value() or b""] = seen.get(m.value() or b"", 0) + 1
    for m in reader.consume(500, 0.5):  # anything more that is there
        if m.error() is None:
            seen[m.value() or b""] = seen.get(m.value() or b"", 0) + 1
    reader.close()
    return {
        "group_offset": int(tp.offset),
        "written": len(want),
        "read_once": sum(1 for v in want if seen.get(v) == 1),
        "read_again": sum(n - 1 for v, n in seen.items() if v in want and n > 1),
        "read_stray": sum(n for v, n in seen.items() if v not in want),
    }


def run_confluent(a: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    lines: list[str] = []
    logger = logging.getLogger("bench-txn.rdkafka")
    logger.addHandler(Lines(lines, lambda r: r.getMessage()))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    config = {"bootstrap.servers": a["bootstrap"], "transactional.id": a["transactional_id"]}
    config |= {"linger.ms": 1, "transaction.timeout.ms": 60000, "message.timeout.ms": 15000}
    producer = Producer({**config, "debug": "eos", "logger": logger})
    reader = {"bootstrap.servers": a["bootstrap"], "group.id": GROUP, "enable.auto.commit": False}
    consumer = Consumer({**reader, "isolation.level": "read_committed"})

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


def response_of(record: logging.LogRecord) -> Any:
    """The response a kafka-python TransactionManager DEBUG record logs, if it logs one."""
    if str(record.msg).startswith("Received transactional") and isinstance(record.args, tuple):
        return record.args[0]
    return None


def run_kafka_python(a: dict[str, Any]) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    responses: list[Any] = []
    logger = logging.getLogger("kafka.producer.transaction_manager")
    logger.addHandler(Lines(responses, response_of))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    common = {"bootstrap_servers": a["bootstrap"], "request_timeout_ms": 30000}
    common |= {"reconnect_backoff_max_ms": 500}
    txn = {"transactional_id": a["transactional_id"], "transaction_timeout_ms": 60000}
    producer = KafkaProducer(**common, **txn, linger_ms=1, acks="all", max_block_ms=10000)
    # group_id None: kafka-python's group consume returns nothing on Tansu
    reading = {"group_id": None, "enable_auto_commit": False, "fetch_max_wait_ms": 100}
    consumer = KafkaConsumer(**common, **reading, isolation_level="read_committed")
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
    set_up(a)
    result = CLIENTS[a["client"]](a)
    result["checked"] = check(a, int(a["warmup"]) + result["transactions"])
    print(json.dumps(result), flush=True)
