"""Thin, deadline-bounded drivers for the three real Kafka clients used by the integration tests.

Every function here talks to a real broker (through kipside or directly) and gives up with an
AssertionError/TimeoutError at its deadline instead of hanging. Messages are compared as
`Msg(partition, key, value, headers)` so all clients can share one exactly-once check.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import confluent_kafka as ck
from testkit.produce import send_all

from kipside.protocol import (
    ApiKey,
    FetchPartition,
    PartitionData,
    build_frame,
    encode_fetch_request,
    encode_request_header,
    iter_batches,
    parse_fetch_response,
    parse_response_header,
)

SHORT_TIMEOUT_MS = 5000
REQUEST_TIMEOUT_MS = 10000
FLUSH_TIMEOUT = 30.0
CONSUME_TIMEOUT = 30.0
EXTRA_POLL_MS = 300
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]


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


def python_client_common(bootstrap: str, client: str, **extra: Any) -> dict[str, Any]:
    """The settings kafka-python and aiokafka share (they take the same names)."""
    return {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "client_id": f"kipside-it-{client}",
        **extra,
    }


# librdkafka's names of the security settings (confluent-kafka, kcat), and kafka-python's for
# the same (aiokafka's too, but for the CA, which aiokafka takes as an ssl_context).
PYTHON_CLIENT_NAMES = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}


def python_client_names(conf: dict[str, Any]) -> dict[str, Any]:
    """librdkafka's security settings in kafka-python's and aiokafka's names."""
    return {PYTHON_CLIENT_NAMES[name]: value for name, value in conf.items()}


def assigned_conf(common: dict[str, Any], isolation: str) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings for a consumer of assigned partitions."""
    return {
        **common,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": isolation,
        "fetch_max_wait_ms": 100,
    }


class Polled:
    """What kafka-python's poll() or aiokafka's getmany() returned so far, as Msgs."""

    def __init__(self, expect: int, timeout: float) -> None:
        self.got: list[Msg] = []
        self.expect, self.timeout = expect, timeout
        self.deadline = time.monotonic() + timeout

    def wanting(self) -> bool:
        """Whether fewer than `expect` arrived; an AssertionError once the time is up."""
        got, expect = len(self.got), self.expect
        if got >= expect:
            return False
        assert time.monotonic() < self.deadline, f"got {got}/{expect} after {self.timeout} s"
        return True

    def add(self, batches: dict[Any, list[Any]]) -> None:
        for records in batches.values():
            self.got.extend(Msg(r.partition, r.key, r.value, _hdrs(r.headers)) for r in records)


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


class Deliveries:
    """What a confluent-kafka producer's delivery reports said: how many were acknowledged,
    and the errors of the others. Pass `on_delivery` to produce()."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[str] = []

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))


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
    records = (
        {
            "value": m.value,
            "key": m.key,
            "partition": m.partition,
            "headers": list(m.headers) or None,
        }
        for m in msgs
    )
    send_all(p, topic, records, errors)
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


def group_committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets `group` has committed for `topic`, per partition, as an admin client reads
    them (ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(ck_config(bootstrap))
    fut = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10
    )[group]
    res = fut.result(timeout=15)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topic}


def ck_read_to_end(
    consumer: ck.Consumer, partitions: int, expect: int, timeout: float
) -> list[Any]:
    """The messages of an assigned consumer (with enable.partition.eof) until `expect` arrived
    AND each of its `partitions` reported its end after that, so an extra (duplicate or
    aborted) message is caught rather than left unread."""
    got: list[Any] = []
    at_end: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout
    while len(got) < expect or len(at_end) < partitions:
        assert time.monotonic() < deadline, (
            f"got {len(got)}/{expect} after {timeout} s, at end: {sorted(at_end)}"
        )
        m = consumer.poll(0.2)
        if m is None:
            continue
        err, where = m.error(), (str(m.topic()), m.partition() or 0)
        if err is not None and err.code() == ck.KafkaError._PARTITION_EOF:
            at_end.add(where)
        elif err is not None:
            raise AssertionError(f"consumer error: {err}")
        else:
            at_end.discard(where)
            got.append(m)
    return got


def consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    isolation: str = "read_uncommitted",
    timeout: float = CONSUME_TIMEOUT,
    *,
    client: str = "confluent-kafka",
    conf: dict[str, Any] | None = None,
) -> tuple[list[Msg], Watermarks]:
    """Read every partition from the beginning (no group) until `expect` messages arrived, with
    confluent-kafka (which then waits for every partition's end, see ck_read_to_end) or with
    kafka-python (which stops at `expect` and polls once more). `conf`: more client settings
    (TLS, SASL), in the client's own names."""
    if client == "kafka-python":
        return _kp_consume_assigned(
            bootstrap, topic, partitions, isolation, Polled(expect, timeout), conf or {}
        )
    assert client == "confluent-kafka", f"no assigned reader for {client!r}"
    c = ck_consumer(
        bootstrap,
        f"unused-{topic}",
        **{"isolation.level": isolation, "enable.partition.eof": True, **(conf or {})},
    )
    try:
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        got = [ck_msg(m) for m in ck_read_to_end(c, partitions, expect, timeout)]
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
    return python_client_common(bootstrap, "kafka-python", reconnect_backoff_max_ms=500)


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


def _kp_consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str,
    polled: Polled,
    conf: dict[str, Any],
) -> tuple[list[Msg], Watermarks]:
    """consume_assigned with kafka-python."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**assigned_conf(kp_common(bootstrap), isolation), **conf)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        while polled.wanting():
            polled.add(c.poll(timeout_ms=200))
        polled.add(c.poll(timeout_ms=EXTRA_POLL_MS))  # anything beyond `expect`?
        lows = c.beginning_offsets(tps)
        # highwater(): from the last Fetch response (see consume_assigned about ListOffsets)
        return polled.got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        c.close(autocommit=False)


# --------------------------------------------------------------------------- aiokafka


def aio_common(bootstrap: str) -> dict[str, Any]:
    return python_client_common(bootstrap, "aiokafka", retry_backoff_ms=50)


def aio_group_member(bootstrap: str, group: str, *topics: str, **conf: Any) -> Any:
    """An aiokafka consumer in `group` (not started) that commits by hand and starts from the
    earliest offsets, with a 6 s session and a 0.5 s heartbeat so a rebalance takes seconds.
    `conf`: more settings, or other values, in aiokafka's names."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        *topics,
        **{
            **aio_common(bootstrap),
            "group_id": group,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 500,
            "fetch_max_wait_ms": 100,
            **conf,
        },
    )


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
    bootstrap: str, topic: str, partitions: int, expect: int, **conf: Any
) -> tuple[list[Msg], Watermarks]:
    """consume_assigned with aiokafka, read_uncommitted: aiokafka's transactions fail on
    Tansu 0.6.0, so nothing here reads with read_committed through it. `conf`: more settings
    (TLS, SASL)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(**assigned_conf(aio_common(bootstrap), "read_uncommitted"), **conf)
    try:
        await c.start()
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        polled = Polled(expect, CONSUME_TIMEOUT)
        while polled.wanting():
            polled.add(await c.getmany(timeout_ms=200))
        polled.add(await c.getmany(timeout_ms=EXTRA_POLL_MS))  # anything beyond `expect`?
        lows = await c.beginning_offsets(tps)
        return polled.got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        await c.stop()


def produce_and_read_back(
    client: str,
    bootstrap: str,
    topic: str,
    msgs: Sequence[Msg],
    partitions: int,
    conf: dict[str, Any],
) -> tuple[list[Msg], Watermarks]:
    """`client` (confluent-kafka, kafka-python or aiokafka) produces `msgs`, then reads the
    topic's `partitions` back by assignment until all arrived (consume_assigned); `conf`: more
    settings (TLS, SASL) for both, in the client's own names."""
    if client == "aiokafka":
        run_async(aio_produce(bootstrap, topic, msgs, **conf))
        read = aio_consume_assigned(bootstrap, topic, partitions, len(msgs), **conf)
        found: tuple[list[Msg], Watermarks] = run_async(read)
        return found
    if client == "kafka-python":
        kp_produce(bootstrap, topic, msgs, **conf)
    else:
        ck_produce(bootstrap, topic, msgs, conf=conf)
    return consume_assigned(bootstrap, topic, partitions, len(msgs), client=client, conf=conf)


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

RAW_FETCH_BYTES = 16 << 20
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


def fetch_partition(
    sock: socket.socket, topic: str, partition: int, offset: int, correlation_id: int
) -> PartitionData:
    """One Fetch v4 (read_uncommitted) of one partition from `offset` on a plain socket: what
    the broker stored, which client APIs hide. Written and read by kipside's own codec."""
    fetch = FetchPartition(topic, partition, offset, RAW_FETCH_BYTES)
    body = encode_fetch_request(
        4, [fetch], max_wait_ms=100, min_bytes=1, max_bytes=RAW_FETCH_BYTES, isolation_level=0
    )
    header = encode_request_header(ApiKey.FETCH, 4, correlation_id, "kipside-it-raw")
    sock.sendall(build_frame(header, body))
    frame = read_frame(sock)
    answer = parse_response_header(frame, ApiKey.FETCH, 4)
    assert answer.correlation_id == correlation_id, (answer.correlation_id, correlation_id)
    (data,) = parse_fetch_response(frame, answer.body_offset, 4).partitions
    assert data.error_code == 0, f"Fetch error {data.error_code} for {topic}[{partition}]"
    return data


def raw_fetch_batches(
    bootstrap: str, topic: str, partition: int, timeout: float = 5.0
) -> list[BatchInfo]:
    """The headers of the batches stored in one partition from offset 0 (one Fetch)."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        records = fetch_partition(sock, topic, partition, 0, 7).records
    return [
        BatchInfo(
            b.base_offset,
            b.records_count,
            int(b.compression),
            b.is_transactional,
            b.is_control,
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
        )
        for b in iter_batches(records, allow_partial_tail=True)
    ]


def read_frame(sock: socket.socket) -> bytes:
    """One whole frame, its size prefix included, from a blocking socket."""
    head = _recv_exact(sock, 4)
    return head + _recv_exact(sock, struct.unpack(">i", head)[0])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf
