"""Columnar topics through kipside with real clients and the real broker (Tansu): what the four
clients produce is stored as carriers (read raw over a direct connection to the broker), and
what they consume through kipside is what was produced, exactly once, in order, at the same
offsets; group offsets, transactions, idempotence, values that don't fit the schema and
encrypted fields on the way.

One kipside with a columnar rule file serves the module, in front of the session's broker.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import create_topics, needs_kipside, unique_name
from testkit import tools
from testkit.broker import Broker
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import scrape
from testkit.ports import free_port

from kipside.protocol import (
    COLUMNAR_HEADER,
    ColumnarKeyError,
    ColumnarKeys,
    RecordBatchView,
    TimestampType,
    columnar_version,
    decode_columnar_batch,
    decode_columnar_record,
    decode_columns,
    iter_batches,
    read_columnar_segment,
)

from .clients import Msg, assert_exactly_once_in_order, by_partition, run_async
from .clients_aiokafka import aio_consume_assigned, aio_produce
from .clients_confluent import (
    ck_config,
    ck_consumer,
    ck_msg,
    ck_produce,
    ck_read_to_end,
    group_committed,
)
from .clients_kafka_python import kp_produce
from .clients_read_back import consume_assigned
from .fault_kit.stack import fault_stack
from .raw_batches import fetch_partition

pytestmark = [pytest.mark.integration, needs_kipside("columnar topics are kipside's")]

PARTITIONS = 2
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "amount": {"type": "number"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id"],
}
KEYS = "write_key: k1\nkeys:\n  k1: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"
RULES = """
topics:
  - topic: "col-*"
    columnar: {schema: orders.json, min_records: 5}
  - topic: "enc-*"
    columnar:
      schema: orders.json
      encrypt: {columns: [user], key_file: keys.yaml}
"""
# Batches large enough to convert: every client lingers until a few records are in.
LINGER = {
    "confluent-kafka": {"linger.ms": 50},
    "kafka-python": {"linger_ms": 50},
    "aiokafka": {"linger_ms": 50},
}


@dataclass(frozen=True)
class Stack:
    broker: Broker
    kipside: Kipside
    admin_port: int

    @property
    def bootstrap(self) -> str:
        return self.kipside.bootstrap

    def topic(self, prefix: str = "col") -> str:
        name = unique_name(prefix)
        create_topics(self.bootstrap, [name], PARTITIONS)
        return name


@pytest.fixture(scope="module")
def stack(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("columnar")
    (folder / "orders.json").write_text(json.dumps(SCHEMA))
    (folder / "keys.yaml").write_text(KEYS)
    (folder / "rules.yaml").write_text(RULES)
    port = free_port()
    ks = start_kipside(
        tansu, folder / "kipside", folder / "rules.yaml", extra_args=["--admin", str(port)]
    )
    try:
        yield Stack(tansu, ks, port)
    finally:
        assert ks.stop() == 0


def value(i: int) -> bytes:
    """An order as producers write it: compact, in the schema's field order, so the value a
    consumer gets back from a carrier is the same bytes."""
    body = {
        "id": i,
        "user": f"user-{i % 7}",
        "amount": i + 0.25,
        "at": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:07.{i % 1000:03d}Z",
        "tags": ["a", "b"][: i % 3],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def orders(n: int, first: int = 0, headers: bool = True) -> list[Msg]:
    return [
        Msg(i % PARTITIONS, b"order-%d" % i, value(i), (("seq", b"%d" % i),) if headers else ())
        for i in range(first, first + n)
    ]


# ---- what the broker stores -----------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One partition's log as the broker returns it: each batch, and its records decoded."""

    batches: list[RecordBatchView]
    records: list[tuple[int, bytes | None, bytes | None]]  # offset, key, value (data only)

    @property
    def carriers(self) -> list[RecordBatchView]:
        return [b for b in self.batches if columnar_version(b) == 1]


def stored(broker: Broker, topic: str, partition: int, keys: ColumnarKeys | None = None) -> Stored:
    """Read raw from the broker itself (no kipside): carriers decoded with kipside.protocol's
    public function, ordinary batches by the record kernel."""
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        data = fetch_partition(sock, topic, partition, 0, 5)
    batches = list(iter_batches(bytes(data.records)))
    records: list[tuple[int, bytes | None, bytes | None]] = []
    for view in batches:
        if view.is_control:
            continue
        if columnar_version(view) == 1:
            records += [(r.offset, r.key, r.value) for r in decode_columnar_batch(view, keys)]
            continue
        columns = decode_columns([view])
        for i in range(len(columns)):
            k, v = columns.key, columns.value
            key = bytes(k.data[k.offsets[i] : k.offsets[i + 1]]) if k.valid[i] else None
            records.append(
                (int(columns.offset[i]), key, bytes(v.data[v.offsets[i] : v.offsets[i + 1]]))
            )
    return Stored(batches, records)


def assert_stored_as_carriers(
    broker: Broker, topic: str, sent: Sequence[Msg], keys: ColumnarKeys | None = None
) -> list[Stored]:
    """Each partition holds exactly what was sent, at offsets 0, 1, 2, ...; its batches of
    five records or more are carriers, and there is at least one."""
    logs = []
    for p in range(PARTITIONS):
        log = stored(broker, topic, p, keys)
        want = [(m.key, m.value) for m in sent if m.partition == p]
        assert [(k, v) for _, k, v in log.records] == want
        assert [o for o, _, _ in log.records] == list(range(len(want)))
        data = [b for b in log.batches if not b.is_control]
        assert all(columnar_version(b) == 1 for b in data if b.records_count >= 5), data
        logs.append(log)
    assert any(log.carriers for log in logs), "no batch was stored as a carrier"
    return logs


# ---- clients ------------------------------------------------------------------------------


def kcat(args: list[str], stdin: str | None = None) -> str:
    binary = tools.require("kcat", "the fourth client")
    proc = subprocess.run(
        [binary, "-X", "socket.timeout.ms=5000", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kcat {args} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def kcat_produce(bootstrap: str, topic: str, msgs: Sequence[Msg]) -> None:
    """kcat -P, one partition at a time (it has no per-line partition), key|value lines."""
    for p in range(PARTITIONS):
        lines = [f"{(m.key or b'').decode()}|{m.value.decode()}" for m in msgs if m.partition == p]
        args = ["-b", bootstrap, "-P", "-t", topic, "-p", str(p), "-K|", "-X", "linger.ms=50"]
        kcat(args, stdin="\n".join(lines) + "\n")


def kcat_consume(bootstrap: str, topic: str) -> list[Msg]:
    out = kcat(
        ["-b", bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%p\t%k\t%s\n"]
    )
    rows = [line.split("\t") for line in out.splitlines() if line]
    return [Msg(int(p), k.encode(), v.encode()) for p, k, v in rows]


def produce(client: str, bootstrap: str, topic: str, msgs: Sequence[Msg]) -> None:
    if client == "confluent-kafka":
        ck_produce(bootstrap, topic, msgs, conf={"enable.idempotence": True, **LINGER[client]})
    elif client == "kafka-python":
        kp_produce(bootstrap, topic, msgs, **LINGER[client])
    elif client == "aiokafka":
        run_async(aio_produce(bootstrap, topic, msgs, **LINGER[client]))
    else:
        kcat_produce(bootstrap, topic, msgs)


def consume(client: str, bootstrap: str, topic: str, expect: int) -> list[Msg]:
    if client in ("confluent-kafka", "kafka-python"):
        return consume_assigned(bootstrap, topic, PARTITIONS, expect, client=client)[0]
    if client == "aiokafka":
        got: tuple[list[Msg], Any] = run_async(
            aio_consume_assigned(bootstrap, topic, PARTITIONS, expect)
        )
        return got[0]
    return kcat_consume(bootstrap, topic)


def without_headers(msgs: Sequence[Msg]) -> list[Msg]:
    return [m._replace(headers=()) for m in msgs]


CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kcat"]


@pytest.fixture(scope="module")
def produced_by_confluent(stack: Stack) -> tuple[str, list[Msg]]:
    """One topic an idempotent confluent-kafka producer filled through kipside."""
    topic = stack.topic()
    sent = orders(400)
    produce("confluent-kafka", stack.bootstrap, topic, sent)
    return topic, sent


@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_reads_carriers_back_as_the_records_produced(
    stack: Stack, produced_by_confluent: tuple[str, list[Msg]], client: str
) -> None:
    topic, sent = produced_by_confluent
    got = consume(client, stack.bootstrap, topic, len(sent))
    if client == "kcat":  # its output format has no headers
        sent = without_headers(sent)
    assert_exactly_once_in_order(sent, got)


def test_the_broker_stores_carriers_that_keep_the_producers_fields(
    stack: Stack, produced_by_confluent: tuple[str, list[Msg]]
) -> None:
    topic, sent = produced_by_confluent
    for log in assert_stored_as_carriers(stack.broker, topic, sent):
        data = [b for b in log.batches if not b.is_control]
        # Idempotence: one producer, sequence numbers counting records across carriers.
        assert (
            len({(b.producer_id, b.producer_epoch) for b in data}) == 1 and data[0].producer_id >= 0
        )
        sequences = [(b.base_sequence, b.records_count) for b in data]
        assert [s for s, _ in sequences] == [
            sum(n for _, n in sequences[:i]) for i in range(len(data))
        ]


def test_a_consumer_without_kipside_decodes_carriers_with_the_public_function(
    stack: Stack, produced_by_confluent: tuple[str, list[Msg]]
) -> None:
    """confluent-kafka straight from the broker gets each carrier as its records: the first
    with the marker header and the segment, then empty placeholders. decode_columnar_record
    turns the first back into the producer's records, as docs/columnar.md shows."""
    topic, sent = produced_by_confluent
    consumer = ck_consumer(
        stack.broker.bootstrap, unique_name("direct"), **{"enable.partition.eof": True}
    )
    try:
        consumer.assign(
            [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        delivered = ck_read_to_end(consumer, PARTITIONS, len(sent), 30)
    finally:
        consumer.close()
    got: list[Msg] = []
    placeholders = 0
    for message in delivered:
        headers = message.headers() or []
        if any(name == COLUMNAR_HEADER for name, _ in headers):
            kind, timestamp = message.timestamp()
            records = decode_columnar_record(
                message.value(),
                headers,
                offset=message.offset(),
                timestamp=timestamp,
                timestamp_type=TimestampType(1 if kind == ck.TIMESTAMP_LOG_APPEND_TIME else 0),
            )
            assert [r.offset for r in records] == list(
                range(message.offset(), message.offset() + len(records))
            )
            got += [
                Msg(
                    message.partition(),
                    r.key,
                    r.value or b"",
                    tuple((k, v if v is not None else b"") for k, v in r.headers),
                )
                for r in records
            ]
        elif message.key() is None and message.value() is None and not headers:
            placeholders += 1
        else:
            got.append(ck_msg(message))
    assert len(delivered) == len(sent) and placeholders > 0  # one message per offset
    assert_exactly_once_in_order(sent, got)


@pytest.mark.parametrize("client", CLIENTS[1:])
def test_every_client_produces_carriers(stack: Stack, client: str) -> None:
    topic = stack.topic()
    sent = orders(300, headers=client != "kcat")
    produce(client, stack.bootstrap, topic, sent)
    assert_stored_as_carriers(stack.broker, topic, sent)
    assert_exactly_once_in_order(
        sent, consume("confluent-kafka", stack.bootstrap, topic, len(sent))
    )


def test_group_offsets_and_lag_count_records_as_without_carriers(stack: Stack) -> None:
    """A group commits the offsets of the records it read (the log's end: no lag), and a
    consumer started at an offset inside a carrier gets the records from exactly there. The
    partitions are assigned, not subscribed: what carriers could change is the offsets read and
    committed, not the group's membership, whose join would only add seconds."""
    topic = stack.topic()
    sent = orders(200)
    produce("confluent-kafka", stack.bootstrap, topic, sent)
    group = unique_name("g")
    consumer = ck_consumer(stack.bootstrap, group)
    try:
        consumer.assign(
            [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        got: list[Any] = []
        while len(got) < len(sent):
            got += [m for m in consumer.consume(100, 1.0) if not m.error()]
        consumer.commit(asynchronous=False)
        marks = {
            p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), cached=True)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()
    committed = group_committed(stack.bootstrap, group, topic)
    assert committed == {p: 100 for p in range(PARTITIONS)} == marks
    assert any(stored(stack.broker, topic, 0).carriers)
    middle = ck.Consumer(ck_config(stack.bootstrap, **{"group.id": unique_name("g")}))
    try:
        middle.assign([ck.TopicPartition(topic, 0, 7)])
        first = None
        while first is None:
            message = middle.poll(1.0)
            first = message if message is not None and not message.error() else None
    finally:
        middle.close()
    assert (first.offset(), first.value()) == (7, [m for m in sent if m.partition == 0][7].value)


def test_transactions_read_the_same_as_an_ordinary_topic(stack: Stack) -> None:
    """Commit, abort (flushed), commit to a columnar topic and to an ordinary one: consumers
    through kipside read the same from both, read_committed and not, whatever the broker's
    transaction support; the carriers keep the transactional bit and the markers stay."""
    columnar, plain = stack.topic(), stack.topic("plain")
    producer = ck.Producer(
        ck_config(
            stack.bootstrap,
            **{
                "transactional.id": unique_name("tx"),
                "transaction.timeout.ms": 10000,
                **LINGER["confluent-kafka"],
            },
        )
    )
    producer.init_transactions(15)
    batches = [(orders(40, 0), True), (orders(40, 40), False), (orders(40, 80), True)]
    for msgs, commit in batches:
        producer.begin_transaction()
        for topic in (columnar, plain):
            ck_produce(stack.bootstrap, topic, msgs, producer=producer)
        (producer.commit_transaction if commit else producer.abort_transaction)(15)
    every = [m for msgs, _ in batches for m in msgs]
    for isolation in ("read_uncommitted", "read_committed"):
        views = [
            consume_assigned(stack.bootstrap, topic, PARTITIONS, 80, isolation)[0]
            for topic in (columnar, plain)
        ]
        assert by_partition(views[0]) == by_partition(views[1])  # each partition in order
    assert_exactly_once_in_order(
        every, consume_assigned(stack.bootstrap, columnar, PARTITIONS, 120)[0]
    )
    log = stored(stack.broker, columnar, 0)
    assert log.carriers and all(b.is_transactional for b in log.batches)
    assert sum(b.is_control for b in log.batches) == 3


def test_a_batch_that_does_not_fit_the_schema_goes_as_it_was(stack: Stack) -> None:
    before = scrape(stack.admin_port)
    topic = stack.topic()
    sent = orders(60)
    sent[31] = sent[31]._replace(value=b"not json")  # partition 1's batch can't be a carrier
    produce("confluent-kafka", stack.bootstrap, topic, sent)
    assert_exactly_once_in_order(sent, consume("confluent-kafka", stack.bootstrap, topic, 60))
    assert stored(stack.broker, topic, 0).carriers and not stored(stack.broker, topic, 1).carriers
    after = scrape(stack.admin_port)

    def grew(outcome: str) -> float:
        labels = {"direction": "produce", "outcome": outcome}
        name = "kipside_columnar_batches_total"
        return after.value(name, **labels) - before.value(name, default=0.0, **labels)

    assert grew("misfit") >= 1 and grew("converted") >= 1
    assert "went to the broker as it was, not as a carrier (misfit)" in stack.kipside.log()


def test_encrypted_fields_need_the_key(stack: Stack) -> None:
    """Consumers through kipside (which holds the key) read plaintext; the broker's copy has the
    field encrypted: without the key the segment reads without it, and decoding is refused."""
    topic = stack.topic("enc")
    sent = orders(100)
    produce("confluent-kafka", stack.bootstrap, topic, sent)
    assert_exactly_once_in_order(sent, consume("confluent-kafka", stack.bootstrap, topic, 100))
    keys = ColumnarKeys.parse(KEYS, "keys.yaml")
    (log, _) = assert_stored_as_carriers(stack.broker, topic, sent, keys)
    carrier = log.carriers[0]
    with pytest.raises(ColumnarKeyError, match="user"):
        decode_columnar_batch(carrier)
    segment = decode_columnar_batch(carrier, keys)  # the key decrypts it
    assert segment[0].value == next(m for m in sent if m.partition == 0).value
    columns = decode_columns([carrier])
    first = bytes(columns.value.data[columns.value.offsets[0] : columns.value.offsets[1]])
    assert "user" not in read_columnar_segment(first).column_names
    assert b"user-" not in first  # no plaintext of the field in the broker's bytes


def test_an_idempotent_producer_through_faults_writes_each_record_once(tmp_path: Path) -> None:
    """Through kipside killed and restarted, then its broker connections cut, mid-traffic: an
    idempotent producer's retried batches become carriers again with the same sequence numbers,
    so the broker keeps each record once, in order."""
    (tmp_path / "orders.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "keys.yaml").write_text(KEYS)
    with fault_stack(tmp_path, RULES) as faults:
        topic = unique_name("col")
        create_topics(faults.bootstrap, [topic], PARTITIONS)
        sent = orders(3000)
        errors: list[str] = []
        producer = ck.Producer(
            ck_config(
                faults.bootstrap,
                **{
                    "enable.idempotence": True,
                    "linger.ms": 20,
                    "message.timeout.ms": 60000,
                    "on_delivery": lambda err, _msg: errors.extend([str(err)] if err else []),
                },
            )
        )

        def write(part: Sequence[Msg]) -> None:  # not flushed: batches are in flight
            for m in part:
                headers: list[tuple[str, str | bytes | None]] = list(m.headers)
                producer.produce(topic, m.value, m.key, partition=m.partition, headers=headers)
                producer.poll(0)

        write(sent[:1000])
        faults.restart(signal.SIGKILL, down_for=0.3)
        write(sent[1000:2000])
        faults.inject(faults.relay.cut, 0.3, faults.relay.restore)
        write(sent[2000:])
        assert producer.flush(60) == 0 and not errors, errors[:3]
        got, _ = consume_assigned(faults.bootstrap, topic, PARTITIONS, len(sent))
        assert_exactly_once_in_order(sent, got)
        assert_stored_as_carriers(faults.broker, topic, sent)
