"""TCP relays the integration tests put between kipside and the broker.

CountingRelay forwards every byte unchanged, in both directions, between whoever dials it (kipside)
and one broker address, and independently of kipside counts what goes upstream: connections
(open now, peak concurrently open, total accepted), requests by API key, and the CRC of every
record batch in every ProduceRequest it forwards. It can also hold the client->broker direction
(so requests stay in flight) and cut every connection it carries (a broker/network failure).

One deliberate exception to "unchanged", off by default: with `kafka_acks0=True` the relay
swallows the broker's responses to acks=0 ProduceRequests. Tansu 0.6.0 answers acks=0
requests (seen here: raw socket, no proxy), Apache Kafka never does (kafka-rules.md); the
option makes the test broker behave like Apache Kafka on this point. Either way the relay
counts those answers (`acks0_answers`), so a test can show that the broker did answer.

It runs trio in a background thread; every public method is called from the test's thread and
is safe to call while traffic flows. It binds and dials loopback only, and never re-encodes a
byte: frames are parsed only to be counted.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.framing import FrameDecoder
from protocol.headers import parse_request_header, response_correlation_id
from protocol.produce import MAX_VERSION, MIN_VERSION, parse_produce_request
from protocol.records import RecordBatchError, iter_batches
from proxy.session import produce_acks

LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT = 5.0
READ_SIZE = 256 * 1024
CONTROL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class BatchSeen:
    """One record batch of one ProduceRequest, as it passed the relay."""

    topic: str
    partition: int
    crc: int
    crc_valid: bool
    acks: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    compression: int


def produce_batches(frame: bytes) -> list[BatchSeen]:
    """Every record batch in a ProduceRequest frame (size prefix included), in request order.

    Raises ProtocolError / RecordBatchError if the frame is not a readable v3+ ProduceRequest.
    """
    header = parse_request_header(frame)
    if header.api_key != ApiKey.PRODUCE:
        raise ValueError(f"api key {header.api_key} is not Produce")
    if not MIN_VERSION <= header.api_version <= MAX_VERSION:
        raise ValueError(f"Produce v{header.api_version} has no magic-v2 record batches")
    request = parse_produce_request(frame, header.body_offset, header.api_version)
    out = []
    for partition in request.partitions:
        if partition.records is None:
            continue
        for batch in iter_batches(partition.records):
            out.append(
                BatchSeen(
                    partition.topic,
                    partition.partition,
                    batch.crc,
                    batch.crc_valid(),
                    request.acks,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.records_count,
                    int(batch.compression),
                )
            )
    return out


@dataclass(slots=True)
class RelayedConnection:
    """One connection the relay carried (kipside -> relay -> broker)."""

    number: int
    opened_at: float
    closed_at: float | None = None
    requests: Counter[int] = field(default_factory=Counter)
    """Requests forwarded to the broker on this connection, by API key."""
    acks0_correlation_ids: set[int] = field(default_factory=set)
    """acks=0 ProduceRequests forwarded whose (non-Kafka) response may still come."""


@dataclass(frozen=True, slots=True)
class RelayCounts:
    """A consistent copy of the relay's counters at one moment."""

    accepted: int
    open: int
    peak_open: int
    requests: Counter[int]
    held_now: int
    cut: int
    swallowed_acks0_responses: int
    acks0_requests: int
    """acks=0 ProduceRequests forwarded to the broker."""
    acks0_answers: int
    """Responses the broker sent to acks=0 ProduceRequests (swallowed or forwarded)."""


@dataclass(slots=True)
class _Live:
    scope: trio.CancelScope
    client: trio.SocketStream


class CountingRelay:
    """A byte-for-byte TCP relay on 127.0.0.1:0 to one broker that counts what passes upstream.

    Usage: `relay = CountingRelay().start()`, then `relay.upstream = (host, port)` before the
    first connection arrives (the broker may need the relay's port before it can start).
    """

    def __init__(self, upstream: tuple[str, int] | None = None, *, kafka_acks0: bool = False):
        self.upstream = upstream
        self.kafka_acks0 = kafka_acks0
        self._swallowed = 0
        self._acks0_requests = 0
        self._acks0_answers = 0
        self.port = 0
        self._lock = threading.Lock()
        self._accepted = 0
        self._open = 0
        self._peak_open = 0
        self._cut = 0
        self._held_now = 0
        self._requests: Counter[int] = Counter()
        self._batches: list[BatchSeen] = []
        self._connections: list[RelayedConnection] = []
        self._problems: list[str] = []
        self._live: dict[int, _Live] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._released: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._crash: BaseException | None = None

    # Control (test thread) --------------------------------------------------------------

    def start(self) -> CountingRelay:
        self._thread = threading.Thread(target=self._thread_main, name="CountingRelay", daemon=True)
        self._thread.start()
        if not self._ready.wait(CONTROL_TIMEOUT) or self._crash is not None:
            raise RuntimeError(f"CountingRelay did not start: {self._crash!r}")
        return self

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def counts(self) -> RelayCounts:
        with self._lock:
            return RelayCounts(
                self._accepted,
                self._open,
                self._peak_open,
                Counter(self._requests),
                self._held_now,
                self._cut,
                self._swallowed,
                self._acks0_requests,
                self._acks0_answers,
            )

    def batches(self) -> list[BatchSeen]:
        """Every record batch forwarded upstream so far, in forwarding order."""
        with self._lock:
            return list(self._batches)

    def connections(self) -> list[RelayedConnection]:
        with self._lock:
            return [
                RelayedConnection(c.number, c.opened_at, c.closed_at, Counter(c.requests), set())
                for c in self._connections
            ]

    def problems(self) -> list[str]:
        """Frames the relay forwarded but could not read (there should be none)."""
        with self._lock:
            return list(self._problems)

    def reset_peak(self) -> None:
        """Start a new measuring period: the peak becomes what is open now."""
        with self._lock:
            self._peak_open = self._open

    def hold(self) -> None:
        """Stop forwarding client->broker: requests stay in flight until release() or cut."""
        self._call(self._hold)

    def release(self) -> None:
        self._call(self._release)

    def cut_all(self) -> int:
        """Reset every connection the relay carries (RST to the client, close to the broker).

        Returns how many were cut. New connections are accepted as before.
        """
        return self._call(self._cut_all)

    def close(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        self._call(self._request_stop)
        self._thread.join(CONTROL_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("CountingRelay did not stop")

    def _call(self, fn: Callable[[], int | None]) -> int:
        if self._token is None:
            raise RuntimeError("CountingRelay is not running")
        result = trio.from_thread.run_sync(fn, trio_token=self._token)
        return int(result or 0)

    # The relay (trio thread) ------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start() or the test's assertions
            self._crash = exc
            with self._lock:
                self._problems.append(f"relay crashed: {exc!r}")
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._released = trio.Event()
        self._released.set()
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._carry, listeners)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _request_stop(self) -> None:
        assert self._stop is not None
        self._cut_all()
        self._stop.set()

    def _hold(self) -> None:
        self._released = trio.Event()

    def _release(self) -> None:
        assert self._released is not None
        self._released.set()

    def _cut_all(self) -> int:
        live = list(self._live.values())
        for conn in live:
            # SO_LINGER 0: close() sends RST, as a failed network path or killed broker would.
            with contextlib.suppress(OSError):
                conn.client.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            conn.scope.cancel()
        with self._lock:
            self._cut += len(live)
        return len(live)

    async def _carry(self, client: trio.SocketStream) -> None:
        with self._lock:
            self._accepted += 1
            number = self._accepted
            self._open += 1
            self._peak_open = max(self._peak_open, self._open)
            record = RelayedConnection(number, time.monotonic())
            self._connections.append(record)
        broker: trio.SocketStream | None = None
        try:
            with trio.CancelScope() as scope:
                self._live[number] = _Live(scope, client)
                if self.upstream is None:
                    raise OSError("CountingRelay.upstream was never set")
                with trio.fail_after(CONNECT_TIMEOUT):
                    broker = await trio.open_tcp_stream(*self.upstream)
                async with trio.open_nursery() as nursery:
                    both = nursery.cancel_scope
                    nursery.start_soon(self._to_broker, client, broker, record, both)
                    nursery.start_soon(self._to_client, broker, client, record, both)
        except (OSError, trio.TooSlowError) as exc:
            self._problem(f"connection {number}: cannot reach the broker: {exc!r}")
        finally:
            self._live.pop(number, None)
            if broker is not None:
                await trio.aclose_forcefully(broker)
            await trio.aclose_forcefully(client)
            with self._lock:
                self._open -= 1
                record.closed_at = time.monotonic()

    async def _to_broker(
        self,
        client: trio.SocketStream,
        broker: trio.SocketStream,
        record: RelayedConnection,
        both: trio.CancelScope,
    ) -> None:
        decoder = FrameDecoder()
        try:
            while data := await client.receive_some(READ_SIZE):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    await self._wait_released()
                    self._count(frame, record)
                    await broker.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except ProtocolError as exc:
            self._problem(
                f"connection {record.number}: client sent bytes that are not Kafka: {exc}"
            )
        both.cancel()

    async def _wait_released(self) -> None:
        assert self._released is not None
        released = self._released
        if released.is_set():
            return
        with self._lock:
            self._held_now += 1
        try:
            await released.wait()
        finally:
            with self._lock:
                self._held_now -= 1

    def _count(self, frame: bytes, record: RelayedConnection) -> None:
        try:
            header = parse_request_header(frame)
        except ProtocolError as exc:
            self._problem(f"connection {record.number}: bad request header: {exc}")
            return
        batches: list[BatchSeen] = []
        problem = None
        acks0 = False
        if header.api_key == ApiKey.PRODUCE:
            try:
                if produce_acks(frame, header) == 0:
                    acks0 = True
                    record.acks0_correlation_ids.add(header.correlation_id)
                batches = produce_batches(frame)
            except (ProtocolError, RecordBatchError, ValueError) as exc:
                problem = f"connection {record.number}: unreadable ProduceRequest: {exc}"
        with self._lock:
            self._requests[header.api_key] += 1
            self._acks0_requests += acks0
            record.requests[header.api_key] += 1
            self._batches.extend(batches)
            if problem is not None:
                self._problems.append(problem)

    async def _to_client(
        self,
        broker: trio.SocketStream,
        client: trio.SocketStream,
        record: RelayedConnection,
        both: trio.CancelScope,
    ) -> None:
        decoder = FrameDecoder()
        try:
            while data := await broker.receive_some(READ_SIZE):
                if not self.kafka_acks0:
                    await client.send_all(data)  # as received; frames are only counted
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    # Registered before the request was written, so never too late.
                    correlation_id = response_correlation_id(frame)
                    unasked = correlation_id in record.acks0_correlation_ids
                    if unasked:
                        record.acks0_correlation_ids.discard(correlation_id)
                        with self._lock:
                            self._acks0_answers += 1
                    if not self.kafka_acks0:
                        continue  # already forwarded
                    if unasked:
                        with self._lock:
                            self._swallowed += 1
                        continue
                    await client.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except ProtocolError as exc:
            self._problem(
                f"connection {record.number}: broker sent bytes that are not Kafka: {exc}"
            )
        both.cancel()

    def _problem(self, text: str) -> None:
        with self._lock:
            self._problems.append(text)
