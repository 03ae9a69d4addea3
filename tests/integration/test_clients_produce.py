"""Real clients through kipside to the real broker (Tansu): each client library produces and
consumes back exactly once: every compression codec, idempotent or not, acks=0 and 1, many
partitions and large records, several producers on the same partitions at once, and kcat.

Run: .venv/bin/pytest tests/integration -q -p no:cacheprovider -x
KIPSIDE_TEST_DIRECT=1 points the same tests at Tansu itself (kipside-only tests skip), which is
how a broker limitation is told apart from a proxy bug.
"""

from __future__ import annotations

import re
import subprocess
import threading
from typing import Any

import pytest
from conftest import DIRECT, NewTopicFactory, Target
from testkit import tools

from .clients import CLIENTS, Msg, assert_exactly_once_in_order, make_messages, run_async
from .clients_aiokafka import aio_consume_assigned, aio_produce
from .clients_confluent import ck_produce
from .clients_kafka_python import kp_produce
from .clients_read_back import consume_assigned
from .raw_batches import CODECS, raw_fetch_batches
from .tansu_bugs import AIOKAFKA_INIT_PRODUCER_ID_V0, kcat_api_versions_v3

pytestmark = pytest.mark.integration

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
