"""What the coalescing tests (tests/integration/test_coalesce*.py) share: kipside with shared
lanes in front of a CountingRelay in front of Tansu, the lines kipside logs when a lane fails,
and reading the log back to check that every producer's messages are there once, in order.

Every test starts its own Tansu that advertises a CountingRelay's port, so kipside (whose
--upstream is the relay) reaches the broker only through the relay, which counts, independently
of kipside, every request and connection kipside makes upstream and records the CRC, producer
id, epoch and base sequence of every record batch it forwards.

Tansu answers acks=0 ProduceRequests, Apache Kafka does not: `coalesce_stack(...,
kafka_acks0=True)` has the relay swallow those answers, so the broker behaves as Apache Kafka
would; with kafka_acks0=False it passes them on, to show that kipside copes with Tansu as it is.
Without kipside's shared lanes (KIPSIDE_TEST_DIRECT=1, --one-to-one) the stack skips its test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import skip_unless_shared_lanes, unique_name
from relaykit.tansu import tansu_behind
from relays import BatchSeen, CountingRelay
from testkit.broker import Broker
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import Metrics, scrape
from testkit.ports import free_port

from .clients_confluent import ck_read_to_end
from .coalesce_producers import ProducerSpec, parse_value

LANES = 2
BROKERS = 1  # Tansu is one node (111)
PARTITIONS = 4
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CONSUME_TIMEOUT = 60.0
LANE_FAILED_LINE = re.compile(
    r"lane (\d+) to node (\d+) failed \((.*)\): (\d+) batches unanswered, "
    r"(\d+) client connections closed so their clients resend in order"
)
CLIENT_CLOSED_LINE = re.compile(
    r"kipside\.session: client ([\d.]+:\d+)(?: \(client\.id '([^']*)'\))?: "
    r"lane (\d+) to node (\d+) failed: (.*); closing so the client resends$"
)
CLOSED_FOR_SHORT_API_LINE = re.compile(
    r"kipside\.session: client ([\d.]+:\d+)(?: \(client\.id '([^']*)'\))?: no answer to "
    r".*; closing so the client retries$"
)


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """Tansu advertising the relay, the relay in front of it, kipside in front of the relay."""

    relay: CountingRelay
    broker: Broker  # bootstrap = the relay: what kipside dials and what Tansu advertises
    broker_port: int  # Tansu's real listener (nothing in the tests dials it)
    kipside: Kipside
    admin_port: int

    def metrics(self) -> Metrics:
        """kipside's /metrics."""
        return scrape(self.admin_port)


@contextlib.contextmanager
def coalesce_stack(tmp_path: Path, *, kafka_acks0: bool) -> Iterator[Stack]:
    """The stack, for one test. kafka_acks0: the broker, like Apache Kafka, never answers acks=0
    ProduceRequests (a broker never answers acks=0 produce; Tansu does, and the relay swallows
    those answers); False: Tansu as it is, its answers to acks=0 ProduceRequests reach kipside."""
    skip_unless_shared_lanes("coalescing")
    relay = CountingRelay(kafka_acks0=kafka_acks0)
    with tansu_behind(relay) as tansu, _kipside_behind(relay, tansu, tmp_path) as s:
        yield s


@contextlib.contextmanager
def _kipside_behind(relay: CountingRelay, tansu: Broker, tmp_path: Path) -> Iterator[Stack]:
    via_relay = dataclasses.replace(tansu, port=relay.port)
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"coalescing:\n  enabled: true\n  lanes: {LANES}\n  linger_ms: 0\n")
    admin_port = free_port()
    kipside: Kipside | None = None
    try:
        kipside = start_kipside(
            via_relay,
            tmp_path / "kipside",
            rules=rules,
            extra_args=["--admin", f"127.0.0.1:{admin_port}"],
        )
        stdout = kipside.stdout_path.read_text()
        assert f"kipside: admin listening on http://127.0.0.1:{admin_port}" in stdout, stdout
        yield Stack(relay, via_relay, tansu.port, kipside, admin_port)
        code = kipside.stop()
        assert code == 0, f"kipside exited with {code} after SIGTERM:\n{kipside.log()[-3000:]}"
    finally:
        if kipside is not None and kipside.proc.poll() is None:
            kipside.proc.kill()


def stack_fixture(name: str, *, kafka_acks0: bool) -> Any:
    """A test module's fixture `name`: the stack for each of its tests, as coalesce_stack.
    `stack = stack_fixture("stack", kafka_acks0=True)`: a broker that, like Apache Kafka, never
    answers acks=0 ProduceRequests; kafka_acks0=False: Tansu as it is."""

    @pytest.fixture(name=name)
    def the_stack(tmp_path: Path) -> Iterator[Stack]:
        """Tansu advertising a CountingRelay, kipside with shared lanes in front of the relay."""
        with coalesce_stack(tmp_path, kafka_acks0=kafka_acks0) as s:
            yield s

    return the_stack


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- reading it back


@dataclass(frozen=True)
class LogRecord:
    producer: str
    seq: int
    topic: str
    partition: int
    offset: int


def consume_everything(
    bootstrap: str, targets: list[tuple[str, int]], at_least: int, timeout: float = CONSUME_TIMEOUT
) -> list[LogRecord]:
    """Every record in the given partitions, read with an assigned confluent-kafka consumer.

    Stops once at least `at_least` arrived and every partition reported its end after that,
    so an extra (duplicate) record is read rather than left behind.
    """
    import confluent_kafka as ck

    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{unique_name('g')}",
            "client.id": "coalesce-checker",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "socket.timeout.ms": 10000,
        }
    )
    try:
        consumer.assign([ck.TopicPartition(t, p, ck.OFFSET_BEGINNING) for t, p in targets])
        got = []
        for msg in ck_read_to_end(consumer, len(targets), at_least, timeout):
            producer, seq = parse_value(msg.value() or b"")
            where = (str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            got.append(LogRecord(producer, seq, *where))
        return got
    finally:
        consumer.close()


def log_index(records: list[LogRecord]) -> Counter[tuple[str, int]]:
    return Counter((r.producer, r.seq) for r in records)


def assert_logged_once(
    bootstrap: str,
    targets: list[tuple[str, int]],
    sent: set[tuple[str, int]],
    specs: list[ProducerSpec],
) -> list[LogRecord]:
    """The partitions hold each sent (producer, seq) exactly once, nothing else, and each
    producer's records in send order; returns what they hold."""
    records = consume_everything(bootstrap, targets, at_least=len(sent))
    counts = log_index(records)
    dups = {k: n for k, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} messages duplicated, e.g. {list(dups.items())[:5]}"
    assert set(counts) == sent, (
        f"missing {sorted(sent - set(counts))[:10]}, unexpected {sorted(set(counts) - sent)[:10]}"
    )
    assert_order_per_partition(records, {s.name for s in specs})
    return records


def assert_order_per_partition(records: list[LogRecord], producers: set[str]) -> None:
    """Each producer's records appear in send order within every partition."""
    by_key: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        if r.producer in producers:
            by_key[(r.producer, r.topic, r.partition)].append((r.offset, r.seq))
    for key, entries in by_key.items():
        seqs = [seq for _, seq in sorted(entries)]
        assert seqs == sorted(seqs), f"{key}: out of order in the log: {seqs[:40]}"


def wait_for_idle_upstream(stack: Stack, timeout: float = 15.0) -> None:
    """Wait until only kipside's lanes are open upstream (the topic-creating admin client's
    own connection has gone), so the produce phase starts from a known set of connections."""
    wait_until(
        lambda: stack.relay.counts().open <= LANES * BROKERS,
        timeout,
        f"upstream connections to drop to {LANES * BROKERS}: {stack.relay.counts()}",
    )


# --------------------------------------------------------------------------- idempotent order


def sequence_gaps(batches: list[BatchSeen]) -> tuple[list[str], int]:
    """Idempotent batches forwarded to the broker ahead of a predecessor, and how many were
    re-sent.

    Per producer id, epoch and partition, in forwarding order: a batch whose base sequence lies
    beyond the end of every batch forwarded before it overtook one (the broker answers it
    OUT_OF_ORDER_SEQUENCE_NUMBER); one at or below that end is a resend (the broker writes it
    if the first copy never arrived, or answers it as a duplicate).
    """
    next_sequence: dict[tuple[int, int, str, int], int] = {}
    gaps, resent = [], 0
    for b in batches:
        if b.producer_id < 0:
            continue
        key = (b.producer_id, b.producer_epoch, b.topic, b.partition)
        expected = next_sequence.get(key, 0)
        if b.base_sequence > expected:
            gaps.append(
                f"producer id {b.producer_id} epoch {b.producer_epoch} {b.topic}[{b.partition}]: "
                f"sequence {b.base_sequence} forwarded before {expected}"
            )
        elif b.base_sequence < expected:
            resent += 1
        next_sequence[key] = max(expected, b.base_sequence + b.records_count)
    return gaps, resent
