"""Thin, deadline-bounded drivers for the three real Kafka clients used by the integration tests.

Every function here talks to a real broker (through kipside or directly) and gives up with an
AssertionError/TimeoutError at its deadline instead of hanging. Messages are compared as
`Msg(partition, key, value, headers)` so all clients can share one exactly-once check.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import confluent_kafka as ck

SHORT_TIMEOUT_MS = 5000
REQUEST_TIMEOUT_MS = 10000
FLUSH_TIMEOUT = 30.0
CONSUME_TIMEOUT = 30.0
EXTRA_POLL_MS = 300


class Msg(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


Watermarks = dict[int, tuple[int, int]]


def make_messages(
    n: int, partitions: int, tag: str = "m", headers: bool = True, size: int = 120
) -> list[Msg]:
    """n messages spread round-robin over explicit partitions, compressible, in send order."""
    out = []
    for i in range(n):
        body = f"{tag}-{i:06d}|".encode()
        value = body + b"kipside-" * max(0, (size - len(body)) // 8)
        hdrs = (("seq", str(i).encode()), ("tag", tag.encode())) if headers else ()
        out.append(Msg(i % partitions, f"k{i}".encode(), value, hdrs))
    return out


def by_partition(msgs: Iterable[Msg]) -> dict[int, list[Msg]]:
    out: dict[int, list[Msg]] = defaultdict(list)
    for m in msgs:
        out[m.partition].append(m)
    return dict(out)


def assert_exactly_once_in_order(
    sent: Sequence[Msg], received: Sequence[Msg], watermarks: Watermarks | None = None
) -> None:
    """Every sent message was received once, with its content, in send order per partition.

    If watermarks (partition -> (low, high)) are given, the log holds exactly what was sent:
    no duplicate was written even if the consumer did not see it.
    """
    want, got = by_partition(sent), by_partition(received)
    assert len(received) == len(sent), f"received {len(received)} messages, sent {len(sent)}"
    for p in sorted(set(want) | set(got)):
        w, g = want.get(p, []), got.get(p, [])
        if w != g:
            first = next(
                (i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b),
                min(len(w), len(g)),
            )
            raise AssertionError(
                f"partition {p}: sent {len(w)}, received {len(g)}; first difference at #{first}: "
                f"sent {w[first : first + 1]!r} received {g[first : first + 1]!r}"
            )
    if watermarks is not None:
        in_log = {p: hi - lo for p, (lo, hi) in watermarks.items()}
        want_counts = {p: len(want.get(p, [])) for p in watermarks}
        assert in_log == want_counts, (
            f"log holds {in_log} records per partition, sent {want_counts}"
        )


def _hdrs(raw: Any) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, bytes(v) if v is not None else b"") for k, v in (raw or ()))


# --------------------------------------------------------------------------- confluent-kafka


def ck_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": SHORT_TIMEOUT_MS,
        "socket.connection.setup.timeout.ms": SHORT_TIMEOUT_MS,
        "topic.metadata.refresh.interval.ms": 10000,
        "client.id": "kipside-it-confluent",
    }
    conf.update(extra)
    return conf


def ck_produce(
    bootstrap: str,
    topic: str,
    msgs: Sequence[Msg],
    producer: ck.Producer | None = None,
    flush_timeout: float = FLUSH_TIMEOUT,
    conf: dict[str, Any] | None = None,
) -> None:
    """Produce msgs with confluent-kafka (a new producer with `conf` unless one is given) and
    assert every delivery succeeded."""
    p = producer or ck.Producer(
        ck_config(bootstrap, **{"linger.ms": 5, "message.timeout.ms": 20000, **(conf or {})})
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for m in msgs:
        while True:
            try:
                p.produce(
                    topic,
                    value=m.value,
                    key=m.key,
                    partition=m.partition,
                    headers=list(m.headers) or None,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(flush_timeout)
    assert left == 0, f"{left} messages undelivered after {flush_timeout} s (errors: {errors[:3]})"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"


def ck_consumer(bootstrap: str, group: str, **conf: Any) -> ck.Consumer:
    return ck.Consumer(
        ck_config(
            bootstrap,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                **conf,
            },
        )
    )


def ck_msg(m: Any) -> Msg:
    return Msg(m.partition(), m.key(), m.value(), _hdrs(m.headers()))


def ck_consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    isolation: str = "read_uncommitted",
    timeout: float = CONSUME_TIMEOUT,
) -> tuple[list[Msg], Watermarks]:
    """Read every partition from the beginning (no group) until `expect` messages arrived."""
    c = ck_consumer(
        bootstrap,
        f"unused-{topic}",
        **{"isolation.level": isolation, "enable.partition.eof": True},
    )
    try:
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        got: list[Msg] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        # Stop only when `expect` arrived AND every partition reported its end after that, so
        # an extra (duplicate or aborted) message is caught rather than left unread.
        while len(got) < expect or len(at_end) < partitions:
            assert time.monotonic() < deadline, (
                f"got {len(got)}/{expect} after {timeout} s, at end: {sorted(at_end)}"
            )
            m = c.poll(0.2)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    at_end.add(m.partition() or 0)
                    continue
                raise AssertionError(f"consumer error: {err}")
            at_end.discard(m.partition() or 0)
            got.append(ck_msg(m))
        # cached=True: the high watermark of the last Fetch response. Tansu 0.6.0 answers
        # ListOffsets(latest) with (base offset of the last batch) + 1, which is wrong for
        # multi-record batches (a broker bug, seen without kipside), so ListOffsets is not used.
        marks = {
            p: c.get_watermark_offsets(ck.TopicPartition(topic, p), cached=True)
            for p in range(partitions)
        }
        return got, marks
    finally:
        c.close()


# --------------------------------------------------------------------------- kafka-python


def kp_common(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "client_id": "kipside-it-kafka-python",
        "reconnect_backoff_max_ms": 500,
    }


def kp_producer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        **{**kp_common(bootstrap), "linger_ms": 5, "max_block_ms": 10000, "acks": "all", **conf}
    )


def kp_send(producer: Any, topic: str, msgs: Sequence[Msg]) -> list[Any]:
    return [
        producer.send(
            topic, value=m.value, key=m.key, partition=m.partition, headers=list(m.headers)
        )
        for m in msgs
    ]


def kp_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], **conf: Any) -> None:
    producer = kp_producer(bootstrap, **conf)
    try:
        futures = kp_send(producer, topic, msgs)
        producer.flush(timeout=FLUSH_TIMEOUT)
        for f in futures:
            f.get(timeout=1)  # raises the delivery error, if any
    finally:
        producer.close(timeout=5)


def kp_consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    isolation: str = "read_uncommitted",
    timeout: float = CONSUME_TIMEOUT,
) -> tuple[list[Msg], Watermarks]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        **kp_common(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation,
        fetch_max_wait_ms=100,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got: list[Msg] = []
        deadline = time.monotonic() + timeout
        while len(got) < expect:
            assert time.monotonic() < deadline, f"got {len(got)}/{expect} after {timeout} s"
            for recs in c.poll(timeout_ms=200).values():
                got.extend(Msg(r.partition, r.key, r.value, _hdrs(r.headers)) for r in recs)
        for recs in c.poll(timeout_ms=EXTRA_POLL_MS).values():  # anything beyond `expect`?
            got.extend(Msg(r.partition, r.key, r.value, _hdrs(r.headers)) for r in recs)
        lows = c.beginning_offsets(tps)
        # highwater(): from the last Fetch response (see ck_consume_assigned about ListOffsets)
        return got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        c.close(autocommit=False)


# --------------------------------------------------------------------------- aiokafka


def aio_common(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "client_id": "kipside-it-aiokafka",
        "retry_backoff_ms": 50,
    }


def run_async(coro: Any, timeout: float = 60.0) -> Any:
    """Run an asyncio coroutine (aiokafka) from a sync test with a hard deadline."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def aio_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], **conf: Any) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**{**aio_common(bootstrap), "linger_ms": 5, "acks": "all", **conf})
    try:
        await producer.start()
        futures = [
            await producer.send(
                topic, value=m.value, key=m.key, partition=m.partition, headers=list(m.headers)
            )
            for m in msgs
        ]
        await asyncio.wait_for(asyncio.gather(*futures), FLUSH_TIMEOUT)
    finally:
        await producer.stop()


async def aio_consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    isolation: str = "read_uncommitted",
    deadline_s: float = CONSUME_TIMEOUT,
) -> tuple[list[Msg], Watermarks]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
        **aio_common(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation,
        fetch_max_wait_ms=100,
    )
    try:
        await c.start()
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        got: list[Msg] = []
        deadline = time.monotonic() + deadline_s
        while len(got) < expect:
            assert time.monotonic() < deadline, f"got {len(got)}/{expect} after {deadline_s} s"
            for recs in (await c.getmany(timeout_ms=200)).values():
                got.extend(Msg(r.partition, r.key, r.value, _hdrs(r.headers)) for r in recs)
        for recs in (await c.getmany(timeout_ms=EXTRA_POLL_MS)).values():  # beyond `expect`?
            got.extend(Msg(r.partition, r.key, r.value, _hdrs(r.headers)) for r in recs)
        lows = await c.beginning_offsets(tps)
        # highwater(): from the last Fetch response (see ck_consume_assigned about ListOffsets)
        return got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        await c.stop()


def call_with_deadline(fn: Any, timeout: float, what: str) -> Any:
    """Run a blocking client call that has no timeout of its own, in a daemon thread.

    Raises TimeoutError after `timeout` s (the thread is abandoned, the test fails).
    """
    import threading

    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=run, name=f"deadline:{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{what} did not return within {timeout} s")
    if error:
        raise error[0]
    return result[0] if result else None


# --------------------------------------------------------------------------- raw record batches

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class BatchInfo(NamedTuple):
    """The header of one stored record batch (magic v2), as a Fetch returns it."""

    base_offset: int
    records: int
    compression: int  # attributes bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
    transactional: bool
    control: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int


def raw_fetch_batches(
    bootstrap: str, topic: str, partition: int, timeout: float = 5.0
) -> list[BatchInfo]:
    """Fetch (v4, read_uncommitted) one partition from offset 0 with a plain socket and return
    the headers of the stored batches: shows what the broker stored (codec, producer id,
    transactional and control bits), which client APIs hide."""
    import socket
    import struct

    host, port = bootstrap.rsplit(":", 1)
    name = topic.encode()
    client_id = b"kipside-it-raw"
    body = struct.pack(">hhih", 1, 4, 7, len(client_id)) + client_id
    body += struct.pack(">iiiib", -1, 100, 1, 16 << 20, 0)  # replica, wait, min, max, isolation
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, partition, 0, 16 << 20)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size_bytes = _recv_exact(s, 4)
        data = _recv_exact(s, struct.unpack(">i", size_bytes)[0])
    pos = 4 + 4  # correlation id, throttle time
    (n_topics,) = struct.unpack_from(">i", data, pos)
    assert n_topics == 1, n_topics
    (name_len,) = struct.unpack_from(">h", data, pos + 4)
    pos += 6 + name_len
    (n_parts,) = struct.unpack_from(">i", data, pos)
    assert n_parts == 1, n_parts
    _part, error, _hw, _lso = struct.unpack_from(">ihqq", data, pos + 4)
    assert error == 0, f"Fetch error {error} for {topic}[{partition}]"
    pos += 4 + 4 + 2 + 8 + 8
    (n_aborted,) = struct.unpack_from(">i", data, pos)
    pos += 4 + max(n_aborted, 0) * 16
    (records_len,) = struct.unpack_from(">i", data, pos)
    pos += 4
    end = pos + max(records_len, 0)
    batches = []
    while pos + 61 <= end:
        base_offset, batch_len = struct.unpack_from(">qi", data, pos)
        if pos + 12 + batch_len > end:
            break  # a partial batch at the end of the response
        magic = data[pos + 16]
        assert magic == 2, f"magic {magic} at offset {base_offset}"
        (attributes,) = struct.unpack_from(">h", data, pos + 21)
        pid, epoch, seq, count = struct.unpack_from(">qhii", data, pos + 43)
        batches.append(
            BatchInfo(
                base_offset,
                count,
                attributes & 0x7,
                bool(attributes & 0x10),
                bool(attributes & 0x20),
                pid,
                epoch,
                seq,
            )
        )
        pos += 12 + batch_len
    return batches


def _recv_exact(sock: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf
