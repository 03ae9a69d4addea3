"""One transactional consume-transform-produce client for bench/txn.py, in its own process.

    python _txn_load.py 'JSON'

Arguments (JSON): client ("confluent-kafka" or "kafka-python"), bootstrap, transactional_id,
input_topic, output_topic, partitions (output partitions), group, warmup (transactions before
the clock starts), transactions (most measured transactions), seconds (most measured time),
input_records, call_timeout (s), deadline (s: the whole run, set-up included).

1. Set-up (confluent-kafka's admin client and a plain producer, whatever the client under test):
   create the output topic (`partitions` partitions) and a one-partition input topic, and write
   `input_records` records to the input.
2. The loop, per transaction: read the next input record (an assigned consumer), begin, produce
   one record to every output partition, send the input offset to the transaction for `group`,
   commit. `warmup` transactions first (connections, coordinator look-ups), then measured ones
   until `transactions` are done or `seconds` have passed.
3. Prints one JSON object: per measured transaction its latency (begin called -> commit
   returned), the measured window's start and end on the system-wide monotonic clock (so the
   parent can pick the relay's events of exactly these transactions), and how many
   CONCURRENT_TRANSACTIONS answers the client itself received in the measured window, read
   from the client's own logs the way tests/integration/test_transactions.py reads them:
   librdkafka's `eos` debug log lines that name the error, kafka-python's TransactionManager
   DEBUG records of the decoded responses.

Kept free of project imports, so its start-up and CPU use are just the client's. Every blocking
call is bounded: the loop runs in a thread the main thread joins with the run's deadline.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

CONCURRENT_TRANSACTIONS = 51
# librdkafka's eos debug log names the error by its description (rd_kafka_err2str) or its name.
RDKAFKA_CONCURRENT = re.compile(
    r"CONCURRENT_TRANSACTIONS|another concurrent operation on the same transaction"
)
KAFKA_PYTHON_TXN_LOGGER = "kafka.producer.transaction_manager"


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------- set-up


def set_up(a: dict[str, Any]) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
    wanted = {a["output_topic"]: int(a["partitions"]), a["input_topic"]: 1}
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=n, replication_factor=1) for t, n in wanted.items()]
    )
    for fut in futures.values():
        fut.result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        listed = admin.list_topics(timeout=10).topics
        if all(
            t in listed and listed[t].error is None and len(listed[t].partitions) == n
            for t, n in wanted.items()
        ):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {sorted(wanted)} did not all appear in metadata")
        time.sleep(0.05)
    errors: list[str] = []
    p = Producer({"bootstrap.servers": a["bootstrap"], "linger.ms": 5})
    for i in range(int(a["input_records"])):
        p.produce(
            a["input_topic"],
            value=f"in-{i:05d}".encode(),
            partition=0,
            on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
        )
    if p.flush(30) != 0 or errors:
        raise RuntimeError(f"input records not delivered: {errors[:1]}")


# --------------------------------------------------------------------------- the loop


class Loop:
    """Counts, times and the measured window; filled by a client's loop."""

    def __init__(self, a: dict[str, Any]) -> None:
        self.a = a
        self.latencies_ms: list[float] = []
        self.start = 0.0
        self.end = 0.0
        self.cpu = 0.0
        self.concurrent_before = 0
        self.concurrent_total = 0
        self.capped = False
        self.client_detail = ""

    def plan(self) -> range:
        return range(int(self.a["warmup"]) + int(self.a["transactions"]))

    def measuring(self, i: int, concurrent_so_far: Callable[[], int]) -> bool:
        """Before transaction i: start the clock at the first measured one; False = stop."""
        warmup = int(self.a["warmup"])
        if i == warmup:
            self.concurrent_before = concurrent_so_far()
            self.cpu = _cpu()
            self.start = time.monotonic()
        if i > warmup and time.monotonic() - self.start > float(self.a["seconds"]):
            self.capped = True
            return False
        return True

    def done(self, i: int, began: float) -> None:
        now = time.monotonic()
        if i >= int(self.a["warmup"]):
            self.latencies_ms.append((now - began) * 1000)
            self.end = now

    def result(self, concurrent_total: int) -> dict[str, Any]:
        n = len(self.latencies_ms)
        elapsed = self.end - self.start
        return {
            "client": self.a["client"],
            "transactions": n,
            "elapsed_s": elapsed,
            "txn_per_s": n / elapsed if elapsed > 0 else 0.0,
            "latencies_ms": self.latencies_ms,
            "start": self.start,
            "end": self.end,
            "time_capped": self.capped,
            "client_concurrent": concurrent_total - self.concurrent_before,
            "client_concurrent_warmup": self.concurrent_before,
            "client_detail": self.client_detail,
            "client_cpu_s": _cpu() - self.cpu,
        }


def _output(i: int, value: bytes, partition: int) -> bytes:
    return value + f"|t{i:05d}|p{partition}".encode()


class _RdkafkaLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.getLogger("bench-txn.rdkafka")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def concurrent_lines(self) -> int:
        """Log lines naming the error (tests/integration/test_transactions.py's count)."""
        return sum(1 for line in self.lines if RDKAFKA_CONCURRENT.search(line))

    def concurrent(self) -> int:
        """Answers carrying the error: librdkafka logs an AddOffsetsToTxn answer twice
        ("AddOffsetsToTxn response from ...: CONCURRENT_TRANSACTIONS (Retry)", then "Failed to
        add offsets to transaction ..."): the second line is not counted. An
        AddPartitionsToTxn answer is logged once per partition ("AddPartitionsToTxn response:
        partition ..."), so it counts once per partition."""
        return sum(
            1
            for line in self.lines
            if RDKAFKA_CONCURRENT.search(line) and "Failed to add offsets" not in line
        )


def run_confluent(a: dict[str, Any], loop: Loop) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    timeout = float(a["call_timeout"])
    log = _RdkafkaLog()
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": a["bootstrap"],
            "transactional.id": a["transactional_id"],
            "linger.ms": 1,
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 15000,
            "debug": "eos",
            "logger": log.logger,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": a["bootstrap"],
            "group.id": a["group"],
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
        }
    )
    input_topic, output_topic = a["input_topic"], a["output_topic"]
    partitions = int(a["partitions"])

    def concurrent() -> int:
        producer.poll(0)  # serves the queued log lines
        return log.concurrent()

    try:
        consumer.assign([TopicPartition(input_topic, 0, 0)])
        group_metadata = consumer.consumer_group_metadata()
        producer.init_transactions(timeout)
        for i in loop.plan():
            if not loop.measuring(i, concurrent):
                break
            message = _ck_next(consumer, i, timeout)
            value: bytes = message.value()
            began = time.monotonic()
            producer.begin_transaction()
            for p in range(partitions):
                producer.produce(
                    output_topic, value=_output(i, value, p), partition=p, on_delivery=on_delivery
                )
            producer.send_offsets_to_transaction(
                [TopicPartition(input_topic, 0, i + 1)], group_metadata, timeout
            )
            producer.commit_transaction(timeout)
            loop.done(i, began)
            if errors:
                raise RuntimeError(f"delivery failed: {errors[0]}")
        producer.flush(5)
        total = concurrent()
    finally:
        consumer.close()
    loop.client_detail = (
        f"{len(log.lines)} librdkafka eos log lines, {log.concurrent_lines()} naming "
        "CONCURRENT_TRANSACTIONS"
    )
    return loop.result(total)


def _ck_next(consumer: Any, position: int, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            raise RuntimeError(f"input consumer: {message.error()}")
        if message.offset() == position:
            return message
    raise RuntimeError(f"input record at offset {position} never arrived")


class _KafkaPythonTxnLog(logging.Handler):
    """kafka-python's TransactionManager DEBUG records of every transactional response."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.responses: list[Any] = []
        logger = logging.getLogger(KAFKA_PYTHON_TXN_LOGGER)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Received transactional response") and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            self.responses.append(args[0])

    def concurrent(self) -> int:
        return sum(1 for r in list(self.responses) if CONCURRENT_TRANSACTIONS in _codes(r))


def _codes(response: Any) -> set[int]:
    codes = set()
    if isinstance(getattr(response, "error_code", None), int):
        codes.add(response.error_code)
    for topic in getattr(response, "results_by_topic_v3_and_below", None) or ():
        for partition in topic.results_by_partition:
            codes.add(int(partition.partition_error_code))
    return codes


def run_kafka_python(a: dict[str, Any], loop: Loop) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    log = _KafkaPythonTxnLog()
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
    consumer = KafkaConsumer(
        **common,
        group_id=None,  # kafka-python's group consume returns nothing on Tansu
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        isolation_level="read_committed",
    )
    input_topic, output_topic = a["input_topic"], a["output_topic"]
    partitions = int(a["partitions"])
    tp = TopicPartition(input_topic, 0)
    timeout = float(a["call_timeout"])
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        producer.init_transactions()
        pending: list[Any] = []
        for i in loop.plan():
            if not loop.measuring(i, log.concurrent):
                break
            value = _kp_next(consumer, tp, i, pending, timeout)
            began = time.monotonic()
            producer.begin_transaction()
            futures = [
                producer.send(output_topic, value=_output(i, value, p), partition=p)
                for p in range(partitions)
            ]
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(i + 1, "", -1)}, a["group"])
            producer.commit_transaction()
            loop.done(i, began)
            for future in futures:
                future.get(timeout=1)
        total = log.concurrent()
    finally:
        consumer.close(autocommit=False)
        producer.close(timeout=5)
    kinds: dict[str, int] = {}
    for r in log.responses:
        name = type(r).__name__.removesuffix("Response")
        kinds[name] = kinds.get(name, 0) + 1
    loop.client_detail = "transactional responses: " + ", ".join(
        f"{name} {count}" for name, count in sorted(kinds.items())
    )
    return loop.result(total)


def _kp_next(consumer: Any, tp: Any, position: int, pending: list[Any], timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while pending:
            record = pending.pop(0)
            if record.offset == position:
                return bytes(record.value)
        for records in consumer.poll(timeout_ms=200, max_records=500).values():
            pending.extend(records)
    raise RuntimeError(f"input record at offset {position} never arrived")


CLIENTS: dict[str, Callable[[dict[str, Any], Loop], dict[str, Any]]] = {
    "confluent-kafka": run_confluent,
    "kafka-python": run_kafka_python,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} 'JSON'", file=sys.stderr)
        return 2
    a: dict[str, Any] = json.loads(argv[1])
    run = CLIENTS[a["client"]]
    box: list[dict[str, Any]] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            set_up(a)
            box.append(run(a, Loop(a)))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name="txn-loop", daemon=True)
    thread.start()
    thread.join(float(a["deadline"]))
    if thread.is_alive():
        print(f"the run did not finish within {a['deadline']} s", file=sys.stderr, flush=True)
        os._exit(3)  # the loop thread is stuck in a client call: don't wait for it
    if failure:
        raise failure[0]
    print(json.dumps(box[0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
