"""Real clients through kipside to the real broker (Tansu): each test asserts a real outcome.

Run: .venv/bin/pytest tests/integration -q -p no:cacheprovider -x
KIPSIDE_TEST_DIRECT=1 points the same tests at Tansu itself (kipside-only tests skip), which is
how a broker limitation is told apart from a proxy bug.

Known broker (Tansu 0.6.0) limitations, seen without kipside (/work/shared/environment.md):
kafka-python's group consume returns nothing, aiokafka's transactions fail on InitProducerId v0.
So groups are tested with confluent-kafka and aiokafka, transactions with confluent-kafka and
kafka-python.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import psutil
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import (
    DIRECT,
    DirectProbe,
    Kipside,
    NewTopicFactory,
    Target,
    fresh_topic,
    unique_name,
)
from testkit import tools
from testkit.broker import TANSU_0_6_0

from .clients import (
    CODECS,
    Deliveries,
    Msg,
    aio_consume_assigned,
    aio_group_member,
    aio_produce,
    assert_exactly_once_in_order,
    call_with_deadline,
    ck_config,
    ck_consumer,
    ck_msg,
    ck_produce,
    consume_assigned,
    kp_common,
    kp_produce,
    kp_producer,
    kp_send,
    make_messages,
    raw_fetch_batches,
    run_async,
)
from .tansu_bugs import (
    AIOKAFKA_INIT_PRODUCER_ID_V0,
    NO_ABORTED_TRANSACTIONS,
    kcat_api_versions_v3,
)

pytestmark = pytest.mark.integration

CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]
COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]
N_MESSAGES = 400
PARTITIONS = 3


# --------------------------------------------------------------------------- produce / consume

# (client, idempotent): an idempotent aiokafka producer cannot start on Tansu 0.6.0.
CLIENT_MODES = [
    pytest.param(
        client,
        idempotent,
        id=f"{client}-{'idempotent' if idempotent else 'plain'}",
        marks=AIOKAFKA_INIT_PRODUCER_ID_V0 if client == "aiokafka" and idempotent else (),
    )
    for client in CLIENTS
    for idempotent in (False, True)
]


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize(("client", "idempotent"), CLIENT_MODES)
def test_produce_consume_exactly_once(
    client: str,
    idempotent: bool,
    compression: str,
    bootstrap: str,
    new_topic: NewTopicFactory,
) -> None:
    """N messages produced by one client are consumed back by the same client library exactly
    once: same count, same key/value/headers, same order per partition, and the log holds
    exactly N records (no duplicate was written)."""
    topic = new_topic(PARTITIONS)
    sent = make_messages(N_MESSAGES, PARTITIONS, tag=f"{client}-{compression}")
    codec = None if compression == "none" else compression
    if client == "confluent-kafka":
        conf: dict[str, Any] = {
            "compression.type": compression,
            "enable.idempotence": idempotent,
            "acks": "all",
        }
        ck_produce(bootstrap, topic, sent, conf=conf)
        got, marks = consume_assigned(bootstrap, topic, PARTITIONS, len(sent))
    elif client == "kafka-python":
        kp_produce(bootstrap, topic, sent, compression_type=codec, enable_idempotence=idempotent)
        got, marks = consume_assigned(bootstrap, topic, PARTITIONS, len(sent), client=client)
    else:

        async def roundtrip() -> tuple[list[Msg], dict[int, tuple[int, int]]]:
            await aio_produce(
                bootstrap, topic, sent, compression_type=codec, enable_idempotence=idempotent
            )
            return await aio_consume_assigned(bootstrap, topic, PARTITIONS, len(sent))

        got, marks = run_async(roundtrip())
    assert_exactly_once_in_order(sent, got, marks)
    # What the broker stored: the client's codec (kipside must never re-encode batches) and
    # a producer id exactly when idempotence is on.
    for p in range(PARTITIONS):
        batches = raw_fetch_batches(bootstrap, topic, p)
        assert sum(b.records for b in batches) == marks[p][1] - marks[p][0], batches
        for b in batches:
            assert b.compression == CODECS[compression], (compression, b)
            assert (b.producer_id >= 0 and b.base_sequence >= 0) == idempotent, b
            assert not b.transactional and not b.control, b


@pytest.mark.parametrize("acks", [0, 1])
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_acks(client: str, acks: int, bootstrap: str, new_topic: NewTopicFactory) -> None:
    """acks=0 (the broker sends no response at all: kipside must neither wait for one nor
    invent one) and acks=1: everything arrives once, in order."""
    topic = new_topic(PARTITIONS)
    sent = make_messages(300, PARTITIONS, tag=f"acks{acks}-{client}")
    if client == "confluent-kafka":
        ck_produce(bootstrap, topic, sent, conf={"acks": acks, "enable.idempotence": False})
    elif client == "kafka-python":
        kp_produce(bootstrap, topic, sent, acks=acks, enable_idempotence=False)
    else:
        run_async(aio_produce(bootstrap, topic, sent, acks=acks))
    got, marks = consume_assigned(bootstrap, topic, PARTITIONS, len(sent))
    assert_exactly_once_in_order(sent, got, marks)


@pytest.mark.parametrize("client", CLIENTS)
def test_many_partitions_and_large_records(
    client: str, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """32 partitions (kafka-python and aiokafka put them all in one ProduceRequest, whose
    response must come back split exactly) and records of ~700 KB (frames spanning many
    reads), consumed back exactly once."""
    parts = 32
    topic = new_topic(parts)
    small = make_messages(640, parts, tag=f"many-{client}", headers=False)
    big = [
        Msg(i % parts, f"big{i}".encode(), f"big-{i}|".encode() + bytes([65 + i]) * 700_000)
        for i in range(4)
    ]
    sent = small + big
    if client == "confluent-kafka":
        ck_produce(bootstrap, topic, sent, conf={"message.max.bytes": 2_000_000})
    elif client == "kafka-python":
        kp_produce(bootstrap, topic, sent, max_request_size=2_000_000)
    else:
        run_async(aio_produce(bootstrap, topic, sent, max_request_size=2_000_000))
    got, marks = consume_assigned(bootstrap, topic, parts, len(sent))
    assert_exactly_once_in_order(sent, got, marks)


def test_concurrent_producers_share_partitions(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """Several producers (confluent-kafka and kafka-python, idempotent and not) write to the
    same partitions at the same time, so batches of different clients for one partition meet
    in kipside: each producer's messages arrive exactly once, in its own order, and the log
    holds exactly the sum."""
    parts = 2
    topic = new_topic(parts)
    specs = [
        ("confluent-kafka", True),
        ("confluent-kafka", True),
        ("confluent-kafka", False),
        ("kafka-python", True),
        ("kafka-python", False),
        ("aiokafka", False),
    ]
    sent = {
        f"p{i}-{client}": make_messages(300, parts, tag=f"p{i}-{client}", headers=False)
        for i, (client, _idem) in enumerate(specs)
    }
    failures: list[str] = []

    def run(tag: str, client: str, idempotent: bool) -> None:
        try:
            if client == "confluent-kafka":
                conf = {"enable.idempotence": idempotent, "acks": "all"}
                ck_produce(bootstrap, topic, sent[tag], conf=conf)
            elif client == "kafka-python":
                kp_produce(bootstrap, topic, sent[tag], enable_idempotence=idempotent)
            else:
                run_async(aio_produce(bootstrap, topic, sent[tag]))
        except BaseException as exc:
            failures.append(f"{tag}: {exc!r}")

    threads = [
        threading.Thread(target=run, args=(tag, client, idem), daemon=True)
        for tag, (client, idem) in zip(sent, specs, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a producer did not finish within 60 s"
    assert not failures, failures
    total = sum(len(v) for v in sent.values())
    got, marks = consume_assigned(bootstrap, topic, parts, total)
    assert sum(hi - lo for lo, hi in marks.values()) == total, marks
    for tag, msgs in sent.items():
        mine = [m for m in got if m.value.startswith(tag.encode() + b"-")]
        assert_exactly_once_in_order(msgs, mine)


# --------------------------------------------------------------------------- kcat


def _kcat(args: list[str], stdin: str | None = None, timeout: float = 30.0) -> str:
    kcat = tools.require("kcat", "a third independent client")
    proc = subprocess.run(
        [kcat, "-X", "socket.timeout.ms=5000", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"kcat {args} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


@kcat_api_versions_v3(DIRECT)
def test_kcat_produce_consume(target: Target, new_topic: NewTopicFactory) -> None:
    """kcat -P then kcat -C -e -o beginning: every line once, in order per partition; kcat -L
    lists only addresses the client may dial (kipside's, when going through kipside)."""
    _kcat_roundtrip(target, new_topic(PARTITIONS))


def _kcat_roundtrip(target: Target, topic: str) -> None:
    n = 300
    lines = [f"key{i}:kcat-{i:05d}" for i in range(n)]
    _kcat(["-b", target.bootstrap, "-P", "-t", topic, "-K:"], stdin="\n".join(lines) + "\n")
    consume = ["-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%p\t%k\t%s\n"]
    out = _kcat(["-b", target.bootstrap, *consume])
    rows = [ln.split("\t") for ln in out.splitlines() if ln]
    values = sorted(r[2] for r in rows)
    assert len(rows) == n, f"kcat consumed {len(rows)} of {n}"
    assert values == sorted(f"kcat-{i:05d}" for i in range(n))
    for r in rows:
        assert r[1] == "key" + str(int(r[2].split("-")[1])), r
    per_part: dict[str, list[int]] = {}
    for p, _k, v in rows:
        per_part.setdefault(p, []).append(int(v.split("-")[1]))
    for p, seq in per_part.items():
        assert seq == sorted(seq), f"partition {p} out of order"

    listing = _kcat(["-b", target.bootstrap, "-L", "-t", topic])
    brokers = re.findall(r"broker (\d+) at ([\d.]+):(\d+)", listing)
    assert brokers, listing
    allowed = target.kipside.ports if target.kipside else {target.broker.port}
    for _node, _host, port in brokers:
        assert int(port) in allowed, f"kcat -L shows broker port {port}; allowed {allowed}"


# --------------------------------------------------------------------------- consumer groups


def _high_watermarks(bootstrap: str, topic: str, partitions: int, expect: int) -> dict[int, int]:
    """High watermarks as Fetch reports them (Tansu's ListOffsets(latest) is wrong)."""
    _, marks = consume_assigned(bootstrap, topic, partitions, expect)
    return {p: hi for p, (_lo, hi) in marks.items()}


def _admin_committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient(ck_config(bootstrap))
    fut = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10
    )[group]
    res = fut.result(timeout=15)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topic}


def _unbalanced(a: Any, b: Any, parts: int) -> str | None:
    """None once members A and B hold disjoint partitions that cover the topic; else what they
    hold (confluent-kafka's and aiokafka's assignment() alike)."""
    pa = {tp.partition for tp in a.assignment()}
    pb = {tp.partition for tp in b.assignment()}
    if pa and pb and not pa & pb and pa | pb == set(range(parts)):
        return None
    return f"A has {sorted(pa)}, B has {sorted(pb)}"


def test_confluent_group_rebalance(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """Member A consumes alone; member B joins; both get partitions; every message is consumed
    exactly once across the members; committed offsets equal the end offsets."""
    parts = 4
    topic = new_topic(parts)
    group = unique_name("g")
    first = make_messages(200, parts, tag="first")
    second = make_messages(200, parts, tag="second")
    ck_produce(bootstrap, topic, first)
    consumed: list[Msg] = []
    by_member: dict[str, list[Msg]] = {"A": [], "B": []}
    commit_errors: list[str] = []

    def member(name: str) -> ck.Consumer:
        c = ck_consumer(
            bootstrap, group, **{"partition.assignment.strategy": "range", "client.id": name}
        )

        def on_revoke(consumer: ck.Consumer, _partitions: list[ck.TopicPartition]) -> None:
            try:  # hand over exactly where we stopped
                consumer.commit(asynchronous=False)
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError._NO_OFFSET:
                    commit_errors.append(str(exc))

        c.subscribe([topic], on_revoke=on_revoke)
        return c

    def poll(name: str, c: ck.Consumer) -> None:
        m = c.poll(0.1)
        if m is None:
            return
        assert not m.error(), f"{name}: {m.error()}"
        consumed.append(ck_msg(m))
        by_member[name].append(ck_msg(m))

    a = member("A")
    b: ck.Consumer | None = None
    try:
        deadline = time.monotonic() + 30
        while len(consumed) < len(first):
            assert time.monotonic() < deadline, f"A alone got {len(consumed)}/{len(first)}"
            poll("A", a)
        a.commit(asynchronous=False)
        assert {tp.partition for tp in a.assignment()} == set(range(parts))

        b = member("B")
        deadline = time.monotonic() + 30
        while (held := _unbalanced(a, b, parts)) is not None:
            assert time.monotonic() < deadline, f"no rebalance: {held}"
            poll("A", a)
            poll("B", b)

        ck_produce(bootstrap, topic, second)
        total = len(first) + len(second)
        deadline = time.monotonic() + 30
        while len(consumed) < total:
            assert time.monotonic() < deadline, f"members got {len(consumed)}/{total}"
            poll("A", a)
            poll("B", b)
        for _ in range(5):  # anything extra (a duplicate) would show up here
            poll("A", a)
            poll("B", b)
        a.commit(asynchronous=False)
        b.commit(asynchronous=False)

        assert not commit_errors, commit_errors
        assert by_member["B"], "member B consumed nothing after the rebalance"
        assert any(m.value.startswith(b"second") for m in by_member["A"]), "A idle after join"
        assert_exactly_once_in_order(first + second, consumed)

        ends = _high_watermarks(bootstrap, topic, parts, len(first) + len(second))
        assert ends == {p: 100 for p in range(parts)}
        assert _admin_committed(bootstrap, group, topic) == ends
        committed = {
            tp.partition: tp.offset
            for c in (a, b)
            for tp in c.committed(list(c.assignment()), timeout=10)
        }
        assert committed == ends
    finally:
        call_with_deadline(a.close, 15, "consumer A close")
        if b is not None:
            call_with_deadline(b.close, 15, "consumer B close")


def test_aiokafka_group_rebalance(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """The same rebalance scenario with aiokafka (its own group protocol implementation)."""
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

    parts = 4
    topic = new_topic(parts)
    group = unique_name("g")
    first = make_messages(200, parts, tag="first")
    second = make_messages(200, parts, tag="second")
    consumed: list[Msg] = []
    by_member: dict[str, list[Msg]] = {"A": [], "B": []}

    class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.consumer: AIOKafkaConsumer | None = None

        async def on_partitions_revoked(self, revoked: Any) -> None:
            if revoked and self.consumer is not None:
                await self.consumer.commit()

        async def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    async def start_member(name: str) -> AIOKafkaConsumer:
        c: AIOKafkaConsumer = aio_group_member(
            bootstrap, group, client_id=name, rebalance_timeout_ms=10000
        )
        try:
            await c.start()
        except BaseException:
            await c.stop()
            raise
        listener = CommitOnRevoke()
        listener.consumer = c
        c.subscribe([topic], listener=listener)
        return c

    async def poll(name: str, c: AIOKafkaConsumer) -> None:
        for recs in (await c.getmany(timeout_ms=100)).values():
            for r in recs:
                m = Msg(r.partition, r.key, r.value, tuple((k, bytes(v)) for k, v in r.headers))
                consumed.append(m)
                by_member[name].append(m)

    async def scenario() -> None:
        await aio_produce(bootstrap, topic, first)
        a = await start_member("A")
        b: AIOKafkaConsumer | None = None
        try:
            deadline = time.monotonic() + 30
            while len(consumed) < len(first):
                assert time.monotonic() < deadline, f"A alone got {len(consumed)}/{len(first)}"
                await poll("A", a)
            await a.commit()
            assert {tp.partition for tp in a.assignment()} == set(range(parts))

            b = await start_member("B")
            deadline = time.monotonic() + 30
            while (held := _unbalanced(a, b, parts)) is not None:
                assert time.monotonic() < deadline, f"no rebalance: {held}"
                await asyncio.gather(poll("A", a), poll("B", b))

            await aio_produce(bootstrap, topic, second)
            total = len(first) + len(second)
            deadline = time.monotonic() + 30
            while len(consumed) < total:
                assert time.monotonic() < deadline, f"members got {len(consumed)}/{total}"
                await asyncio.gather(poll("A", a), poll("B", b))
            for _ in range(3):
                await asyncio.gather(poll("A", a), poll("B", b))
            await a.commit()
            await b.commit()

            assert by_member["B"], "member B consumed nothing after the rebalance"
            assert any(m.value.startswith(b"second") for m in by_member["A"]), "A idle"
            assert_exactly_once_in_order(first + second, consumed)
            ends = {tp.partition: c.highwater(tp) for c in (a, b) for tp in c.assignment()}
            assert ends == {p: 100 for p in range(parts)}
            committed = {}
            for c in (a, b):
                for tp in c.assignment():
                    committed[tp.partition] = await c.committed(tp)
            assert committed == ends
        finally:
            await a.stop()
            if b is not None:
                await b.stop()

    run_async(scenario(), timeout=90)
    ends = _high_watermarks(bootstrap, topic, parts, len(first) + len(second))
    assert _admin_committed(bootstrap, group, topic) == ends


# --------------------------------------------------------------------------- transactions

TXN_CLIENTS = ["confluent-kafka", "kafka-python"]  # aiokafka: see the module docstring


class TxnRun:
    """One transactional producer's history: commit, abort, then a third transaction that is
    observed while still open (last stable offset) and then committed."""

    def __init__(self, client: str, topic: str) -> None:
        self.client, self.topic = client, topic
        self.committed1 = make_messages(60, PARTITIONS, tag="commit1")
        self.aborted = make_messages(60, PARTITIONS, tag="abort")
        self.committed2 = make_messages(60, PARTITIONS, tag="commit2")
        self.view_while_open: list[Msg] = []  # read_committed, third transaction still open
        self.uncommitted_while_open: list[Msg] = []


def _run_confluent_txn(bootstrap: str, run: TxnRun) -> None:
    p = ck.Producer(
        ck_config(
            bootstrap,
            **{
                "transactional.id": unique_name("tx"),
                "transaction.timeout.ms": 10000,
                "linger.ms": 5,
                "message.timeout.ms": 9000,
            },
        )
    )
    p.init_transactions(15)
    for batch, commit in ((run.committed1, True), (run.aborted, False)):
        p.begin_transaction()
        ck_produce(bootstrap, run.topic, batch, producer=p)
        (p.commit_transaction if commit else p.abort_transaction)(15)
    p.begin_transaction()
    ck_produce(bootstrap, run.topic, run.committed2, producer=p)
    _observe_open_transaction(bootstrap, run)
    p.commit_transaction(15)


def _run_kafka_python_txn(bootstrap: str, run: TxnRun) -> None:
    producer = kp_producer(
        bootstrap, transactional_id=unique_name("tx"), transaction_timeout_ms=10000
    )
    try:
        call_with_deadline(producer.init_transactions, 15, "init_transactions")
        for batch, end in (
            (run.committed1, "commit_transaction"),
            (run.aborted, "abort_transaction"),
            (run.committed2, "commit_transaction"),
        ):
            producer.begin_transaction()
            futures = kp_send(producer, run.topic, batch)
            producer.flush(timeout=15)
            for f in futures:
                f.get(timeout=1)
            if batch is run.committed2:
                _observe_open_transaction(bootstrap, run)
            call_with_deadline(getattr(producer, end), 15, end)
    finally:
        producer.close(timeout=5)


def _observe_open_transaction(bootstrap: str, run: TxnRun) -> None:
    before = len(run.committed1) + len(run.aborted)
    run.view_while_open, _ = consume_assigned(bootstrap, run.topic, PARTITIONS, 0, "read_committed")
    run.uncommitted_while_open, _ = consume_assigned(
        bootstrap, run.topic, PARTITIONS, before + len(run.committed2)
    )


@pytest.fixture(scope="module", params=TXN_CLIENTS)
def txn_run(request: pytest.FixtureRequest, target: Target) -> TxnRun:
    """The transactional history, run once per client and shared by the tests below."""
    if target.kipside is not None:
        target.kipside.assert_alive()
    topic = fresh_topic(target.bootstrap, f"txn-{request.param}", PARTITIONS)
    run = TxnRun(request.param, topic)
    if request.param == "confluent-kafka":
        _run_confluent_txn(target.bootstrap, run)
    else:
        _run_kafka_python_txn(target.bootstrap, run)
    return run


def _read_committed(bootstrap: str, run: TxnRun, expect: int) -> list[tuple[str, list[Msg]]]:
    """read_committed views by confluent-kafka and, for kafka-python runs, by kafka-python."""
    args = (bootstrap, run.topic, PARTITIONS, expect, "read_committed")
    views = [("confluent-kafka", consume_assigned(*args)[0])]
    if run.client == "kafka-python":
        views.append(("kafka-python", consume_assigned(*args, client="kafka-python")[0]))
    return views


def test_transactions_commit_abort(txn_run: TxnRun, bootstrap: str) -> None:
    """Commit, abort, commit all succeed; every data record was written once with its commit
    or abort marker; an open transaction stays invisible to read_committed (last stable offset);
    read_committed consumers get every committed message, in order."""
    run = txn_run
    # While the third transaction was open: read_committed stopped before it...
    assert not [m for m in run.view_while_open if m.value.startswith(b"commit2")], (
        "read_committed consumer saw records of a transaction that was still open"
    )
    before_open = [m for m in run.view_while_open if not m.value.startswith(b"abort")]
    assert_exactly_once_in_order(run.committed1, before_open)
    # ... while read_uncommitted saw it.
    assert_exactly_once_in_order(
        run.committed1 + run.aborted + run.committed2, run.uncommitted_while_open
    )

    everything = run.committed1 + run.aborted + run.committed2
    got, marks = consume_assigned(bootstrap, run.topic, PARTITIONS, len(everything))
    assert_exactly_once_in_order(everything, got)
    # Each of the 3 transactions touched every partition: one control record (commit or abort
    # marker) per partition per transaction, after the data records.
    data = {p: sum(1 for m in everything if m.partition == p) for p in range(PARTITIONS)}
    assert {p: hi - lo for p, (lo, hi) in marks.items()} == {p: n + 3 for p, n in data.items()}
    for p in range(PARTITIONS):
        batches = raw_fetch_batches(bootstrap, run.topic, p)
        controls = [b for b in batches if b.control]
        assert len(controls) == 3 and all(b.transactional for b in controls), batches
        assert all(b.transactional and b.producer_id >= 0 for b in batches), batches
        assert len({(b.producer_id, b.producer_epoch) for b in batches}) == 1, batches
        assert sum(b.records for b in batches if not b.control) == data[p]

    committed = run.committed1 + run.committed2
    for _who, view in _read_committed(bootstrap, run, len(committed)):
        visible = [m for m in view if not m.value.startswith(b"abort")]
        assert_exactly_once_in_order(committed, visible)  # whether or not aborted ones show


@NO_ABORTED_TRANSACTIONS
def test_read_committed_hides_aborted(txn_run: TxnRun, bootstrap: str) -> None:
    """read_committed consumers see exactly the committed messages: nothing aborted."""
    run = txn_run
    committed = run.committed1 + run.committed2
    for who, view in _read_committed(bootstrap, run, len(committed)):
        aborted = [m for m in view if m.value.startswith(b"abort")]
        assert not aborted, f"{who} read_committed returned {len(aborted)} aborted records"
        assert_exactly_once_in_order(committed, view)
    assert not [m for m in run.view_while_open if m.value.startswith(b"abort")]
    assert_exactly_once_in_order(run.committed1, run.view_while_open)


# --------------------------------------------------------------------------- the broker's own bugs

_ONLY_0_6_0 = pytest.mark.skipif(
    not TANSU_0_6_0, reason="the premise of the xfails in tansu_bugs.py, true of Tansu 0.6.0"
)


@_ONLY_0_6_0
@pytest.mark.parametrize(
    ("check", "what"),
    [
        ("aiokafka-idempotence", "an idempotent aiokafka producer starts (InitProducerId v0)"),
        ("read-committed-filters-aborted", "read_committed consumers skip aborted records"),
        ("kcat-metadata", "kcat -L reads the broker's ApiVersions v3"),
    ],
)
def test_tansu_itself_fails(check: str, what: str, direct_probe: DirectProbe) -> None:
    """The broker itself, asked without kipside, still fails what tests/integration/tansu_bugs.py
    marks as its bug: so those strict xfails blame the broker, not kipside."""
    ok, detail = direct_probe(check)
    assert not ok, f"Tansu now passes the check '{what}' ({detail}): drop its xfail mark"


def test_confluent_consume_transform_produce(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """The exactly-once loop: a group consumer reads, a transactional producer writes the
    transformed records and commits the consumer's offsets inside each transaction
    (AddOffsetsToTxn + TxnOffsetCommit). Output: every input once, in order; the group's
    committed offsets: the input's end."""
    parts = 2
    source, sink = new_topic(parts, prefix="src"), new_topic(parts, prefix="dst")
    group = unique_name("g")
    inputs = make_messages(200, parts, tag="in", headers=False)
    ck_produce(bootstrap, source, inputs)
    consumer = ck_consumer(bootstrap, group, **{"isolation.level": "read_committed"})
    producer = ck.Producer(
        ck_config(
            bootstrap,
            **{"transactional.id": unique_name("tx"), "transaction.timeout.ms": 10000},
        )
    )
    try:
        producer.init_transactions(15)
        consumer.subscribe([source])
        done = 0
        deadline = time.monotonic() + 40
        while done < len(inputs):
            assert time.monotonic() < deadline, f"transformed {done}/{len(inputs)}"
            batch = consumer.consume(num_messages=50, timeout=0.2)
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                assert not m.error(), m.error()
                value = m.value() or b""
                producer.produce(sink, value.upper(), key=m.key(), partition=m.partition() or 0)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),
                consumer.consumer_group_metadata(),
                15,
            )
            producer.commit_transaction(15)
            done += len(batch)
    finally:
        call_with_deadline(consumer.close, 15, "consumer close")
    want = [Msg(m.partition, m.key, m.value.upper()) for m in inputs]
    got, _ = consume_assigned(bootstrap, sink, parts, len(want), "read_committed")
    assert_exactly_once_in_order(want, got)
    assert _admin_committed(bootstrap, group, source) == {p: 100 for p in range(parts)}


# --------------------------------------------------------------------------- admin


def _allowed_ports(target: Target) -> set[int]:
    return target.kipside.ports if target.kipside else {target.broker.port}


def test_confluent_admin_create_list(target: Target, request: pytest.FixtureRequest) -> None:
    admin = AdminClient(ck_config(target.bootstrap))
    names = {unique_name("adm2", request): 2, unique_name("adm5", request): 5}
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=p, replication_factor=1) for n, p in names.items()],
        operation_timeout=10,
        request_timeout=10,
    )
    for fut in futures.values():
        fut.result(timeout=15)
    md = admin.list_topics(timeout=10)
    for name, count in names.items():
        assert name in md.topics, f"{name} missing from {sorted(md.topics)}"
        assert len(md.topics[name].partitions) == count
        assert md.topics[name].error is None
    assert md.brokers, "no brokers in metadata"
    for b in md.brokers.values():
        assert b.host == "127.0.0.1" and b.port in _allowed_ports(target), b
    # creating an existing topic is an error the client must see (not swallowed)
    dup = admin.create_topics([NewTopic(next(iter(names)), 2, 1)], request_timeout=10)
    with pytest.raises(ck.KafkaException) as exc_info:
        next(iter(dup.values())).result(timeout=15)
    assert exc_info.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    cluster = admin.describe_cluster(request_timeout=10).result(timeout=15)
    for node in cluster.nodes:
        assert node.port in _allowed_ports(target), node


def test_kafka_python_admin_create_list(target: Target, request: pytest.FixtureRequest) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(**kp_common(target.bootstrap))
    try:
        names = {unique_name("kadm1", request): 1, unique_name("kadm4", request): 4}
        admin.create_topics(
            {n: {"num_partitions": p, "replication_factor": 1} for n, p in names.items()},
            timeout_ms=10000,
        )
        listed = set(admin.list_topics())
        assert set(names) <= listed, f"{set(names) - listed} missing from {sorted(listed)}"
        described = {t["name"]: t for t in admin.describe_topics(list(names))}
        for name, count in names.items():
            assert len(described[name]["partitions"]) == count, described[name]
        cluster = admin.describe_cluster()
        assert cluster["brokers"], cluster
        for b in cluster["brokers"]:
            assert b["port"] in _allowed_ports(target), b
    finally:
        admin.close()


# --------------------------------------------------------------------------- parked requests


def test_parked_requests_do_not_stall_other_clients(
    bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """A JoinGroup that the broker parks (Tansu holds the first join ~3 s) and long-poll Fetches
    on an empty topic must not delay another client's produce: a proxy that shared one
    upstream connection for them would add seconds (the broker answers a connection's
    requests one at a time)."""
    topic, idle = new_topic(2), new_topic(1, prefix="idle")
    latencies: list[tuple[float, float]] = []  # (start time, seconds)
    errors: list[str] = []
    stop = threading.Event()

    def produce_one_at_a_time() -> None:
        p = ck.Producer(ck_config(bootstrap, **{"linger.ms": 0, "acks": "all"}))
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            p.produce(topic, f"lat-{i}".encode(), partition=i % 2)
            if p.flush(10) != 0:
                errors.append(f"message {i} not delivered in 10 s")
                return
            latencies.append((t0, time.monotonic() - t0))
            i += 1
            stop.wait(0.002)

    producer = threading.Thread(target=produce_one_at_a_time, daemon=True)
    producer.start()
    joiner = ck_consumer(bootstrap, unique_name("g"))
    poller = ck_consumer(bootstrap, unique_name("g"), **{"fetch.wait.max.ms": 2000})
    try:
        deadline = time.monotonic() + 10
        while len(latencies) < 20:
            assert time.monotonic() < deadline and not errors, f"producer stuck: {errors}"
            time.sleep(0.01)
        poller.assign([ck.TopicPartition(idle, 0, ck.OFFSET_BEGINNING)])
        join_start = time.monotonic()
        joiner.subscribe([topic])
        deadline = time.monotonic() + 20
        while not joiner.assignment():
            assert time.monotonic() < deadline, "consumer never joined the group"
            joiner.poll(0.05)
            poller.poll(0)
        join_end = time.monotonic()
        time.sleep(0.3)
    finally:
        stop.set()
        producer.join(15)
        call_with_deadline(joiner.close, 15, "joiner close")
        call_with_deadline(poller.close, 15, "poller close")
    assert not errors, errors
    during = [lat for t0, lat in latencies if join_start <= t0 <= join_end]
    assert len(during) >= 5, (
        f"only {len(during)} produces while joining ({join_end - join_start:.1f} s)"
    )
    assert max(during) < 1.0, (
        f"produce took up to {max(during):.2f} s while another client's JoinGroup was parked "
        f"({join_end - join_start:.1f} s join; {len(during)} produces, median "
        f"{sorted(during)[len(during) // 2] * 1000:.1f} ms)"
    )


# --------------------------------------------------------------------------- socket table


def _remote_tcp(pid: int) -> list[tuple[str, int]]:
    return [
        (c.raddr.ip, c.raddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.status == psutil.CONN_ESTABLISHED
    ]


def _assert_only_kipside(conns: list[tuple[str, int]], kipside: Kipside, who: str) -> None:
    local = [c for c in conns if c[0] in ("127.0.0.1", "::ffff:127.0.0.1")]
    assert local, f"{who} has no TCP connection to 127.0.0.1 at all: {conns}"
    upstream = int(kipside.upstream.rsplit(":", 1)[1])
    direct = [c for c in conns if c[1] == upstream]
    assert not direct, f"{who} dialled the broker directly: {direct}"
    strays = [c for c in local if c[1] not in kipside.ports]
    assert not strays, f"{who} connected to non-kipside ports {strays}; kipside: {kipside.ports}"
    assert any(c[1] in kipside.node_ports.values() for c in local), (
        f"{who} never reached a per-node listener {kipside.node_ports}: {local}"
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_socket_table_subprocess(
    client: str, kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """A client in a child process, connected and consuming: every one of its TCP connections
    goes to kipside's bootstrap or node ports, none to the broker."""
    topic = new_topic(2)
    script = Path(__file__).with_name("socket_client.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), client, bootstrap, topic, unique_name("g"), "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = call_with_deadline(proc.stdout.readline, 45, f"{client} child READY line")
        assert line.startswith(b"READY"), (line, proc.stderr.read() if proc.stderr else b"")
        assert line.split()[1] == b"20", f"child consumed {line!r}"
        _assert_only_kipside(_remote_tcp(proc.pid), kipside, f"{client} child process")
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_socket_table_in_process(
    kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """Same check on this (pytest) process while kafka-python and confluent-kafka clients are
    connected. Topics are created through kipside, so no harness socket goes to the broker."""
    topic = new_topic(2)
    msgs = make_messages(20, 2)
    producer = kp_producer(bootstrap)
    consumer = ck_consumer(bootstrap, unique_name("g"))
    try:
        futures = kp_send(producer, topic, msgs)
        producer.flush(timeout=15)
        for f in futures:
            f.get(timeout=1)
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < len(msgs):
            assert time.monotonic() < deadline, f"consumed {got}/{len(msgs)}"
            m = consumer.poll(0.1)
            if m is not None and not m.error():
                got += 1
        _assert_only_kipside(_remote_tcp(psutil.Process().pid), kipside, "the pytest process")
    finally:
        producer.close(timeout=5)
        call_with_deadline(consumer.close, 15, "consumer close")


# --------------------------------------------------------------------------- not Kafka at all


def _tls_client_hello() -> bytes:
    """The exact bytes a TLS client sends first (a real ClientHello from Python's ssl)."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="kipside.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[0] == 0x16, hello[:8]  # handshake record
    return hello


NOT_KAFKA: dict[str, tuple[bytes, re.Pattern[str]]] = {
    "garbage": (
        bytes.fromhex("deadbeef") + bytes(range(7, 250, 3)),  # negative frame size, then noise
        re.compile(r"garbage|invalid|malformed|not (a )?kafka|unexpected|bad|frame|size", re.I),
    ),
    "tls": (_tls_client_hello(), re.compile(r"\bTLS\b|\bSSL\b", re.I)),
    "http": (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.0\r\n\r\n",
        re.compile(r"\bHTTP\b", re.I),
    ),
}


def _send_and_expect_close(
    host: str, port: int, payload: bytes, timeout: float = 5.0
) -> tuple[int, bytes]:
    """Send payload on a fresh connection and wait for kipside to close it.

    Returns our local port (to find kipside's log line about this connection) and whatever
    kipside sent back before closing.
    """
    with socket.create_connection((host, port), timeout=timeout) as s:
        local_port: int = s.getsockname()[1]
        s.sendall(payload)
        received = b""
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"kipside kept the connection open after {payload[:16]!r}")
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return local_port, received
            except TimeoutError as exc:
                raise AssertionError(
                    f"kipside kept the connection open {timeout} s after {payload[:16]!r}"
                ) from exc
            if not chunk:
                return local_port, received
            received += chunk


class BackgroundProducer(threading.Thread):
    """A confluent-kafka producer sending continuously until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="background-producer", daemon=True)
        self.topic, self.partitions = topic, partitions
        self.producer = ck.Producer(ck_config(bootstrap, **{"linger.ms": 2}))
        self.stop_event = threading.Event()
        self.sent: list[Msg] = []
        self.reports = Deliveries()
        self.undelivered = -1

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            m = Msg(i % self.partitions, None, f"bg-{i:06d}".encode())
            self.producer.produce(
                self.topic, m.value, partition=m.partition, on_delivery=self.reports.on_delivery
            )
            self.sent.append(m)
            self.producer.poll(0.002)
            i += 1
        self.undelivered = self.producer.flush(15)


@pytest.mark.parametrize("kind", list(NOT_KAFKA))
def test_not_kafka_bytes_are_rejected(
    kind: str, kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """Garbage / a TLS ClientHello / an HTTP request on the bootstrap and on a node port: the
    connection is closed, the log says what arrived (TLS / HTTP), and a confluent-kafka client
    producing at the same time is unaffected."""
    payload, says = NOT_KAFKA[kind]
    topic = new_topic(2)
    bg = BackgroundProducer(bootstrap, topic, 2)
    bg.start()
    try:
        deadline = time.monotonic() + 15
        while bg.reports.acked < 50:
            assert time.monotonic() < deadline, f"producer stuck: {bg.reports.errors[:3]}"
            time.sleep(0.02)
        node_port = next(iter(kipside.node_ports.values()))
        for port in (kipside.port, node_port):
            mark = kipside.log_mark()
            peer, _reply = _send_and_expect_close(kipside.host, port, payload)
            # kipside logs the client's address; find the lines about this connection.
            mine = re.compile(rf"127\.0\.0\.1:{peer}\b")
            kipside.wait_for_log(mine.search, mark, timeout=5)
            time.sleep(0.2)  # then count: one line, not one line per frame or per retry
            lines = [ln for ln in kipside.log_since(mark).splitlines() if mine.search(ln)]
            assert len(lines) == 1 and says.search(lines[0]), (
                f"expected one log line about {kind} from port {peer} on kipside port {port} "
                f"matching {says.pattern!r}; new log:\n" + kipside.log_since(mark)
            )
            assert "Traceback" not in kipside.log_since(mark), kipside.log_since(mark)
        kipside.assert_alive()
        before = bg.reports.acked
        deadline = time.monotonic() + 10
        while bg.reports.acked < before + 50:  # still producing after the rejected connections
            assert time.monotonic() < deadline, f"producer stalled: {bg.reports.errors[:3]}"
            time.sleep(0.02)
    finally:
        bg.stop_event.set()
        bg.join(30)
    assert not bg.is_alive(), "background producer did not finish flushing"
    assert bg.undelivered == 0 and not bg.reports.errors, (bg.undelivered, bg.reports.errors[:3])
    got, marks = consume_assigned(bootstrap, bg.topic, 2, len(bg.sent))
    assert_exactly_once_in_order(bg.sent, got, marks)
