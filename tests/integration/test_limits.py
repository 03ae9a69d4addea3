"""The rule file's limits with a real broker and real clients: kipside refuses or closes the
hostile client, logs it once and counts it, and an idempotent producer beside it loses nothing.

Raw sockets play the hostile clients (an oversized frame, a stalled header, an idle connection,
too many partitions, too many connections, a client that never reads its answers); a
confluent-kafka producer keeps producing through all of it, and a consumer then reads every
record exactly once, in order.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import confluent_kafka as ck
import pytest
from conftest import fresh_topic
from inprocess import InProcessKipside, StartKipside
from testkit.broker import Broker
from testkit.metrics import parse

from kipside.protocol import PartitionBatch, encode_produce_request
from kipside.protocol.apis import ApiKey
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.headers import build_frame, encode_request_header
from kipside.proxy.transport.wire import READ_SIZE

from .clients import Msg, assert_exactly_once_in_order, make_messages
from .clients_confluent import Deliveries, ck_config
from .clients_read_back import consume_assigned

pytestmark = pytest.mark.integration


def _api_versions_roundtrip(sock: socket.socket) -> bytes:
    sock.sendall(build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 7, "limits"), b""))
    decoder = FrameDecoder(min_frame_bytes=4)
    deadline = time.monotonic() + 10
    while (frame := decoder.next_frame()) is None:
        assert time.monotonic() < deadline, "no ApiVersions answer"
        data = sock.recv(65536)
        assert data, "connection closed before the answer"
        decoder.receive_data(data)
    return frame


def test_connections_past_the_limit_are_refused(
    start_kipside_in_process: StartKipside, tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    kipside = start_kipside_in_process(tansu.bootstrap, "limits:\n  max_connections: 2\n")
    host, port = kipside.bootstrap.rsplit(":", 1)
    first = socket.create_connection((host, int(port)), timeout=10)
    second = socket.create_connection((host, int(port)), timeout=10)
    try:
        assert _api_versions_roundtrip(first)[4:8] == (7).to_bytes(4, "big")
        assert _api_versions_roundtrip(second)[4:8] == (7).to_bytes(4, "big")
        third = socket.create_connection((host, int(port)), timeout=10)
        with third:
            third.settimeout(10)
            assert third.recv(1) == b"", "the connection past the limit was not closed"
        # The two within the limit still work.
        assert _api_versions_roundtrip(first)[4:8] == (7).to_bytes(4, "big")
        assert any("limits.max_connections" in r.getMessage() for r in caplog.records)
    finally:
        first.close()
        second.close()
    # Once one closes, a new client gets in again.
    deadline = time.monotonic() + 10
    while kipside.server.stats.client_connections >= 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with socket.create_connection((host, int(port)), timeout=10) as again:
        assert _api_versions_roundtrip(again)[4:8] == (7).to_bytes(4, "big")


# ------------------------------------------------------------------------- every limit at once

PER_CLIENT = 256 * 1024
LIMITS = f"""\
limits:
  max_connections: 24
  max_frame_bytes: 1048576
  max_in_flight_bytes_per_client: {PER_CLIENT}
  max_partitions_per_request: 10
  idle_timeout_ms: 1500
  request_read_timeout_ms: 1000
"""
PARTITIONS = 3
CLOSE_WAIT = 5.0  # seconds a hostile connection may take to be closed by kipside


class SteadyProducer(threading.Thread):
    """An idempotent confluent-kafka producer sending known records, about 1,000 a second,
    until stopped; `reports` counts its acknowledged records as they come."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.topic = topic
        self.messages = make_messages(20_000, PARTITIONS, tag="steady", size=100)
        self.sent: list[Msg] = []
        self.reports = Deliveries()
        self.stop = threading.Event()
        self.producer = ck.Producer(
            ck_config(
                bootstrap,
                **{"enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 30000},
            )
        )

    def run(self) -> None:
        began = time.monotonic()
        for start in range(0, len(self.messages), 20):
            if self.stop.is_set():
                break
            # 20 records every 20 ms (poll returns early when it serves a delivery report).
            while (wait := began + start / 1000 - time.monotonic()) > 0:
                self.producer.poll(wait)
            for m in self.messages[start : start + 20]:
                self.producer.produce(
                    self.topic,
                    m.value,
                    m.key,
                    partition=m.partition,
                    headers=list(m.headers),
                    on_delivery=self.reports.on_delivery,
                )
                self.sent.append(m)
            self.producer.poll(0)
        assert self.producer.flush(30) == 0, "records undelivered 30 s after the last"

    def progressing(self, within: float = 5.0) -> bool:
        """Whether more records are acknowledged within `within` seconds."""
        before, deadline = self.reports.acked, time.monotonic() + within
        while time.monotonic() < deadline:
            if self.reports.acked > before + 50:
                return True
            time.sleep(0.02)
        return False


def _connect(kipside: InProcessKipside) -> socket.socket:
    host, port = kipside.bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_kipside(sock: socket.socket, within: float = CLOSE_WAIT) -> float:
    """Seconds until kipside closed (or reset) this connection; fails after `within`."""
    started = time.monotonic()
    sock.setblocking(False)
    while time.monotonic() - started < within:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if not readable:
            continue
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except ConnectionResetError:
            return time.monotonic() - started
    raise AssertionError(f"kipside did not close the connection within {within} s")


def _closed_now(socks: list[socket.socket]) -> list[socket.socket]:
    """The connections kipside has closed (their end of stream is waiting to be read)."""
    readable, _, _ = select.select(socks, [], [], 0)
    closed = []
    for sock in readable:
        try:
            if sock.recv(1) == b"":
                closed.append(sock)
        except ConnectionResetError:
            closed.append(sock)
    return closed


@contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _limit_counts(kipside: InProcessKipside) -> dict[str, float]:
    metrics = parse(kipside.server.metrics.prometheus_text().decode())
    return {s.labels["limit"]: s.value for s in metrics.matching("kipside_limit_reached_total")}


def _wait_for(condition: Callable[[], bool], what: str, within: float = CLOSE_WAIT) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.02)


def _too_many_partitions() -> bytes:
    batches = [PartitionBatch("limits-raw", p, memoryview(b"")) for p in range(11)]
    body = encode_produce_request(7, acks=1, timeout_ms=1000, partitions=batches)
    header = encode_request_header(ApiKey.PRODUCE, 7, 1, "hostile")
    return build_frame(header, b"".join(bytes(chunk) for chunk in body))


API_VERSIONS_V0 = build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 1, "hostile"), b"")


def _push_without_reading(sock: socket.socket, seconds: float) -> int:
    """ApiVersions requests as fast as kipside takes them, never reading an answer; the
    bytes sent."""
    chunk = API_VERSIONS_V0 * 1000
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            select.select([], [sock], [], 0.05)
    return sent


def _reordered(sent: list[Msg], received: list[Msg]) -> int:
    """Received records that came before one sent earlier in their partition."""
    rank = {m: i for i, m in enumerate(sent)}
    last: dict[int, int] = {}
    out = 0
    for m in received:
        i = rank.get(m, -1)
        out += i < last.get(m.partition, -1)
        last[m.partition] = max(i, last.get(m.partition, -1))
    return out


def test_a_producer_loses_nothing_while_hostile_clients_reach_every_limit(
    start_kipside_in_process: StartKipside, tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kipside.limits")
    kipside = start_kipside_in_process(tansu.bootstrap, LIMITS)
    topic = fresh_topic(kipside.bootstrap, "limits", PARTITIONS)
    producer = SteadyProducer(kipside.bootstrap, topic)
    producer.start()
    try:
        assert producer.progressing(10), "the producer does not produce through kipside"
        _hostile_requests_are_closed(kipside, producer)
        _a_connection_storm_is_refused_past_the_limit(kipside, producer)
        peak, pushed = _a_client_not_reading_its_answers_is_not_read(kipside, producer)
    finally:
        producer.stop.set()
        producer.join(45)
    assert not producer.is_alive(), "the producer did not finish"
    assert producer.reports.errors == []
    assert producer.reports.acked == len(producer.sent)
    received, marks = consume_assigned(kipside.bootstrap, topic, PARTITIONS, len(producer.sent))
    counts = _limit_counts(kipside)
    print(  # the figures docs/reliability.md quotes (pytest -s shows them)
        f"acknowledged {producer.reports.acked}, found {len(received)}, "
        f"duplicates {len(received) - len(set(received))}, "
        f"reordered {_reordered(producer.sent, received)}; in flight at most {peak} bytes "
        f"while a client read none of its answers (max_in_flight_bytes_per_client "
        f"{PER_CLIENT}, pushed {pushed} bytes of requests); "
        f"limits reached {dict(sorted(counts.items()))}"
    )
    assert_exactly_once_in_order(producer.sent, received, marks)
    _every_limit_was_counted_and_logged(counts, caplog)


def _hostile_requests_are_closed(kipside: InProcessKipside, producer: SteadyProducer) -> None:
    """An oversized frame, a stalled header, an idle connection and too many partitions: each
    connection closed (the timeouts on time); the producer still progressing."""
    with _sockets() as hostile:
        # A frame over limits.max_frame_bytes (1 MiB): closed at its size prefix.
        sock = _connect(kipside)
        hostile.append(sock)
        sock.sendall((64 << 20).to_bytes(4, "big") + b"\x00\x12\x00\x00")
        _closed_by_kipside(sock)
        # Slowloris: the first 7 bytes of a request, then nothing.
        sock = _connect(kipside)
        hostile.append(sock)
        sock.sendall(build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 2, "x"), b"")[:7])
        assert 0.9 < _closed_by_kipside(sock) < 2.5  # request_read_timeout_ms: 1000
        # Idle: connected, sends nothing.
        sock = _connect(kipside)
        hostile.append(sock)
        assert 1.4 < _closed_by_kipside(sock) < 3.5  # idle_timeout_ms: 1500
        # A ProduceRequest of 11 partitions, over max_partitions_per_request (10).
        sock = _connect(kipside)
        hostile.append(sock)
        sock.sendall(_too_many_partitions())
        _closed_by_kipside(sock)
        assert producer.progressing(), f"the producer stalled: {_limit_counts(kipside)}"


def _a_connection_storm_is_refused_past_the_limit(
    kipside: InProcessKipside, producer: SteadyProducer
) -> None:
    """30 connections against max_connections 24: those past the limit closed at once, only
    those, each counted; the producer still progressing once the storm is gone."""
    stats = kipside.server.stats
    with _sockets() as storm:
        # Connections past limits.max_connections (24) are closed at once; the rest stay.
        for _ in range(30):
            storm.append(_connect(kipside))
        _wait_for(lambda: stats.client_connections >= 24, "24 open connections")
        time.sleep(0.3)  # refusals are immediate; idle ones close after 1.5 s
        refused = _closed_now(storm)
        open_now = stats.client_connections
    # Every storm connection past the limit was closed, and only those.
    assert open_now == 24 and len(refused) >= 6, (open_now, len(refused))
    assert stats.limit_reached["max_connections"] == len(refused)
    _wait_for(lambda: stats.client_connections < 10, "the storm's connections to close")
    assert producer.progressing(), f"the producer stalled: {_limit_counts(kipside)}"


def _a_client_not_reading_its_answers_is_not_read(
    kipside: InProcessKipside, producer: SteadyProducer
) -> tuple[int, int]:
    """A client sending requests without reading one answer is paused, the producer goes on,
    and kipside holds about max_in_flight_bytes_per_client for it; returns the peak bytes in
    flight and the bytes the client pushed."""
    stats, limits = kipside.server.stats, kipside.server.limits
    with _sockets() as hostile:
        # A client that sends requests without reading one answer: kipside stops reading it
        # once it holds max_in_flight_bytes_per_client for it; the producer goes on.
        sock = _connect(kipside)
        hostile.append(sock)
        peak_before = limits.peak_in_flight
        pushed = _push_without_reading(sock, 1.5)
        assert stats.paused_client_connections == 1
        assert producer.progressing(), (
            f"a client not reading its answers stalled the producer: {_limit_counts(kipside)}"
        )
        # TCP pushed back: what the client could send sits in the sockets, mostly unread.
        read = stats.client_requests[ApiKey.API_VERSIONS] * len(API_VERSIONS_V0)
        assert read < pushed / 4, (read, pushed)
        # What kipside held: the limit, plus answers to requests it had already read (one
        # read of a shared connection's answers) and the producer's few requests.
        peak = limits.peak_in_flight  # the consumer's Fetch answers, later, are larger
        assert peak <= PER_CLIENT + READ_SIZE + 64 * 1024, (peak_before, peak)
    _wait_for(lambda: stats.paused_client_connections == 0, "the paused client to go")
    return peak, pushed


def _every_limit_was_counted_and_logged(
    counts: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    for key in (
        "max_frame_bytes",
        "request_read_timeout_ms",
        "idle_timeout_ms",
        "max_partitions_per_request",
        "max_connections",
        "max_in_flight_bytes_per_client",
    ):
        assert counts.get(key, 0) >= 1, (key, counts)
        assert f"limits.{key}" in caplog.text, key
    # The flood of refused connections was logged once (the rest counted, not logged).
    refusals = [r for r in caplog.records if "limits.max_connections" in r.getMessage()]
    assert len(refusals) == 1 and counts["max_connections"] >= 6
