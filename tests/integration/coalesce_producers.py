"""Producer processes for the coalescing tests (tests/integration/test_coalesce*.py): many real
clients of every library, really concurrent, each reporting what it was told about its messages.

Producers run in separate processes (multiprocessing, spawn) so that many really are
concurrent; each puts "name|seq|" in every value so the log can be checked per producer, and
keeps the lines of its client library's log that tell how it saw a connection end. A process
exits by itself after WORKER_DEADLINE whatever happens: it must never outlive its test. This
module imports no test machinery, so that each spawned process loads little.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_MS = 30000
WORKER_DEADLINE = 100.0  # a producer process exits by itself after this, whatever happens
PROCESS_START_TIMEOUT = 60.0  # spawning ~20 interpreters on 2 busy cores is slow
PRODUCE_TIMEOUT = 60.0
# What a producer process keeps of its client library's log: how it saw the connection end
# and what it did about its batches.
KEPT_CLIENT_LOG = re.compile(
    r"Disconnected|transport failure|Connection lost|Got error produce response|timed out|"
    r"duplicate sequence|out of order|fenc|bump|Produce MessageSet with",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ProducerSpec:
    name: str
    library: str  # confluent-kafka | kafka-python | aiokafka
    acks: int  # -1 = all
    idempotent: bool
    compression: str
    conf: dict[str, Any]
    targets: tuple[tuple[str, int], ...]  # (topic, partition), used round robin
    messages: int  # how many, or the most if running until told to stop
    pause_every: int = 0  # sleep `pause` s after every `pause_every` messages (0: never)
    pause: float = 0.0
    debug: str = ""  # confluent-kafka debug contexts whose log lines are kept


def message_value(name: str, seq: int) -> bytes:
    head = f"{name}|{seq:07d}|".encode()
    return head + b"kipside-coalesce-" * (4 + seq % 7)  # compressible, varied sizes


def parse_value(value: bytes) -> tuple[str, int]:
    name, seq, _ = value.split(b"|", 2)
    return name.decode(), int(seq)


def _target(spec: ProducerSpec, seq: int) -> tuple[str, int]:
    return spec.targets[seq % len(spec.targets)]


def _producer_main(
    spec: ProducerSpec, bootstrap: str, result: str, ready: Any, go: Any, stop: Any
) -> None:
    """Entry point of a producer process: produce, then write what happened to `result`."""
    import threading

    # Whatever happens in here, the process must not outlive the test.
    threading.Timer(WORKER_DEADLINE, os._exit, args=(7,)).start()
    outcome: dict[str, Any] = {"delivered": [], "failed": [], "undelivered": 0, "log": []}
    try:
        runner = {"confluent-kafka": _run_confluent, "kafka-python": _run_kafka_python}
        if spec.library == "aiokafka":
            import asyncio

            asyncio.run(_run_aiokafka(spec, bootstrap, outcome, ready, go, stop))
        else:
            runner[spec.library](spec, bootstrap, outcome, ready, go, stop)
    except BaseException:
        outcome["error"] = traceback.format_exc()
    Path(result).write_text(json.dumps(outcome))
    os._exit(0)


def _produce_loop(spec: ProducerSpec, stop: Any, send: Any) -> None:
    for seq in range(spec.messages):
        if stop.is_set():
            return
        send(seq)
        if spec.pause_every and seq % spec.pause_every == spec.pause_every - 1:
            time.sleep(spec.pause)


def _keep_client_log(outcome: dict[str, Any], logger_name: str) -> logging.Logger:
    """Keep the client library's log lines that KEPT_CLIENT_LOG matches in outcome["log"]."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = record.getMessage()
            if KEPT_CLIENT_LOG.search(line):
                outcome["log"].append(f"{record.levelname} {record.name}: {line}")

    logger = logging.getLogger(logger_name)
    # librdkafka's debug lines are wanted; kafka-python's and aiokafka's are far too many.
    logger.setLevel(logging.DEBUG if logger_name.startswith("rdkafka.") else logging.INFO)
    logger.addHandler(Keep())
    return logger


def _run_confluent(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    import confluent_kafka as ck

    conf = {
        "bootstrap.servers": bootstrap,
        "client.id": spec.name,
        "linger.ms": 0,
        "batch.num.messages": 4,  # many small ProduceRequests (librdkafka: one per partition)
        "compression.codec": spec.compression,
        "request.timeout.ms": REQUEST_TIMEOUT_MS,
        "message.timeout.ms": 60000,
        "socket.timeout.ms": 10000,
        "enable.idempotence": spec.idempotent,
        "acks": "all" if spec.acks == -1 else str(spec.acks),
        **spec.conf,
    }
    # librdkafka's own log (errors always, debug contexts if asked for), filtered.
    conf["logger"] = _keep_client_log(outcome, f"rdkafka.{spec.name}")
    if spec.debug:
        conf["debug"] = spec.debug
    producer = ck.Producer(conf)

    def on_delivery(err: Any, msg: Any) -> None:
        _, seq = parse_value(msg.value())
        if err is None:
            outcome["delivered"].append([seq, msg.topic(), msg.partition()])
        else:
            outcome["failed"].append(
                [seq, msg.topic(), msg.partition(), err.code(), err.name(), err.retriable()]
            )

    producer.list_topics(timeout=15)
    ready.set()
    go.wait(PROCESS_START_TIMEOUT)

    def send(seq: int) -> None:
        topic, partition = _target(spec, seq)
        while True:
            try:
                producer.produce(
                    topic,
                    message_value(spec.name, seq),
                    partition=partition,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)

    _produce_loop(spec, stop, send)
    outcome["undelivered"] = producer.flush(PRODUCE_TIMEOUT)


def _python_producer_conf(spec: ProducerSpec, bootstrap: str, **extra: Any) -> dict[str, Any]:
    """kafka-python's and aiokafka's producer settings for a spec (they take the same names)."""
    return {
        "bootstrap_servers": bootstrap,
        "client_id": spec.name,
        "acks": "all" if spec.acks == -1 else spec.acks,
        "enable_idempotence": spec.idempotent,
        "compression_type": None if spec.compression == "none" else spec.compression,
        "linger_ms": 0,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        **extra,
        **spec.conf,
    }


def _failure(seq: int, topic: str, partition: int, exc: BaseException) -> list[Any]:
    """A failed send as the outcome records it: kafka-python's and aiokafka's errors alike."""
    errno, retriable = getattr(exc, "errno", None), bool(getattr(exc, "retriable", False))
    return [seq, topic, partition, errno, type(exc).__name__, retriable]


def _run_kafka_python(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    from kafka import KafkaProducer

    _keep_client_log(outcome, "kafka")
    producer = KafkaProducer(
        **_python_producer_conf(spec, bootstrap, batch_size=512, max_block_ms=15000)
    )
    try:
        for topic in {t for t, _ in spec.targets}:
            producer.partitions_for(topic)
        ready.set()
        go.wait(PROCESS_START_TIMEOUT)

        def send(seq: int) -> None:
            topic, partition = _target(spec, seq)
            future = producer.send(topic, value=message_value(spec.name, seq), partition=partition)
            future.add_callback(
                lambda md, seq=seq: outcome["delivered"].append([seq, md.topic, md.partition])
            )
            future.add_errback(
                lambda exc, seq=seq, t=topic, p=partition: outcome["failed"].append(
                    _failure(seq, t, p, exc)
                )
            )

        _produce_loop(spec, stop, send)
        producer.flush(timeout=PRODUCE_TIMEOUT)
    finally:
        producer.close(timeout=5)


async def _run_aiokafka(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    _keep_client_log(outcome, "aiokafka")
    producer = AIOKafkaProducer(**_python_producer_conf(spec, bootstrap, max_batch_size=1024))
    await producer.start()
    try:
        for topic in {t for t, _ in spec.targets}:
            await producer.partitions_for(topic)
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, PROCESS_START_TIMEOUT)
        futures = []
        for seq in range(spec.messages):
            if stop.is_set():
                break
            topic, partition = _target(spec, seq)
            future = await producer.send(topic, message_value(spec.name, seq), partition=partition)
            futures.append((seq, topic, partition, future))
            if spec.pause_every and seq % spec.pause_every == spec.pause_every - 1:
                await asyncio.sleep(spec.pause)
        await asyncio.wait_for(producer.flush(), PRODUCE_TIMEOUT)
        for seq, topic, partition, future in futures:
            try:
                md = await future
                if md is None:  # acks=0: aiokafka reports it sent, with no metadata
                    outcome["delivered"].append([seq, topic, partition])
                else:
                    outcome["delivered"].append([seq, md.topic, md.partition])
            except Exception as exc:
                outcome["failed"].append(_failure(seq, topic, partition, exc))
    finally:
        await producer.stop()


@dataclass
class Outcome:
    spec: ProducerSpec
    delivered: list[tuple[int, str, int]]
    failed: list[tuple[int, str, int, Any, str, bool]]
    undelivered: int
    log: list[str]
    error: str | None

    def assert_all_delivered(self) -> None:
        """The producer finished and saw every message delivered."""
        name = self.spec.name
        assert self.error is None, f"{name} crashed:\n{self.error}"
        assert not self.failed, f"{name}: {len(self.failed)} failed, first {self.failed[:3]}"
        assert self.undelivered == 0, f"{name}: {self.undelivered} never delivered"
        assert len(self.delivered) == self.spec.messages, f"{name}: {len(self.delivered)}"


class ProducerFleet:
    """Producer processes started together: ready, go, (stop), results."""

    def __init__(self, specs: list[ProducerSpec], bootstrap: str, workdir: Path) -> None:
        self.specs = specs
        self.bootstrap = bootstrap
        self.workdir = workdir
        ctx = multiprocessing.get_context("spawn")
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.ready = [ctx.Event() for _ in specs]
        self.results = [workdir / f"producer-{spec.name}.json" for spec in specs]
        self.processes = [
            ctx.Process(
                target=_producer_main,
                args=(spec, bootstrap, str(path), ready, self.go, self.stop),
                name=spec.name,
                daemon=True,
            )
            for spec, path, ready in zip(specs, self.results, self.ready, strict=True)
        ]

    def start(self) -> None:
        """Start every process and wait until each has metadata; they then wait for go()."""
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + PROCESS_START_TIMEOUT
        for spec, ready, process in zip(self.specs, self.ready, self.processes, strict=True):
            while not ready.wait(0.2):
                if not process.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(
                        f"producer {spec.name} not ready: {self._result_text(spec.name)}"
                    )

    def _result_text(self, name: str) -> str:
        path = self.workdir / f"producer-{name}.json"
        return path.read_text()[-2000:] if path.exists() else "(no result written)"

    def join(self, timeout: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
        hung = [p.name for p in self.processes if p.is_alive()]
        assert not hung, f"producers still running after {timeout} s: {hung}"
        outcomes = []
        for spec, path in zip(self.specs, self.results, strict=True):
            assert path.exists(), f"producer {spec.name} wrote no result"
            raw = json.loads(path.read_text())
            outcomes.append(
                Outcome(
                    spec,
                    [(d[0], d[1], d[2]) for d in raw["delivered"]],
                    [(f[0], f[1], f[2], f[3], f[4], f[5]) for f in raw["failed"]],
                    raw["undelivered"],
                    raw["log"],
                    raw.get("error"),
                )
            )
        return outcomes

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def targets_of(topics: list[str], partitions: int) -> list[tuple[str, int]]:
    return [(t, p) for t in topics for p in range(partitions)]


def rotated(targets: list[tuple[str, int]], by: int) -> tuple[tuple[str, int], ...]:
    by %= len(targets)
    return tuple(targets[by:] + targets[:by])
