"""The plumbing every test relay shares: a Kafka-frame-aware TCP relay with hooks for filters.

A test relay sits between a client (or kipside) and the real broker (Tansu) to add behaviour
the broker lacks or to inject faults. `Relay` carries each connection it accepts on
127.0.0.1:0 to one upstream address and owns everything that is not the simulation itself:

- trio in a background thread, controlled from the test's thread (`start`, `close`, `_call`),
  with crashes and unreadable traffic reported by `problems()` instead of raised in a test;
- whole frames in both directions (protocol.framing), each request's header parsed, each
  response matched to its request by correlation id, and responses written to the client in
  request order, answers the relay makes itself included (clients and kipside require that);
- faults: `hold`/`release` of the client->broker direction, `cut_all` (RST, as a failed path
  or killed broker would), a delay per direction (`request_delay_ms`, `response_delay_ms`),
  `stop_accepting`/`accept_again` (the port refuses connections, then listens again on the
  same port).

A filter is a subclass that overrides the hooks, which run in the relay's trio thread:
`on_request` decides per request (`FORWARD`, `Forward(rewritten)`, `Answer(frame)`, `DROP`,
`CLOSE`), `on_response` may rewrite or drop the broker's answer, `on_open`/`on_close` see
connections, and `takes_raw_frame`/`on_raw_frame` answer the raw SASL tokens that follow a
SaslHandshake v0 (frames with no Kafka header).
Counters a filter keeps for the test's thread are guarded by `self._lock`.

It binds and dials loopback only, and never changes a byte a hook did not change.
"""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Self, TypeVar

import trio

from kipside.protocol.errors import ProtocolError
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.headers import (
    parse_request_header,
    request_correlation_id,
    response_correlation_id,
)
from kipside.protocol.headers import response_frame as response_frame  # for the filters

from .decisions import FORWARD, Answer, Close, Conn, Decision, Drop, Request

LOOPBACK: Final = "127.0.0.1"
CONNECT_TIMEOUT: Final = 5.0
CONTROL_TIMEOUT: Final = 10.0
READ_SIZE: Final = 256 * 1024

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LinkCounts:
    """A consistent copy of the relay's connection and fault counters."""

    accepted: int
    open: int
    peak_open: int
    held_now: int  # requests waiting for release()
    cut: int  # connections reset by cut_all()


@dataclass(slots=True)
class _Owed:
    """One response owed to the client, in its place in request order."""

    request: Request | None  # None: a raw frame (see Relay.takes_raw_frame)
    done: trio.Event = field(default_factory=trio.Event)
    close: bool = False  # end the connection once this slot is written
    frame: bytes | None = None  # when done: what to write (None: nothing)
    ready_at: float = 0.0  # trio clock: when the broker (or the relay) answered

    def resolve(self, frame: bytes | None) -> None:
        self.frame, self.ready_at = frame, trio.current_time()
        self.done.set()


@dataclass(slots=True)
class _Link:
    """One connection being pumped (trio thread)."""

    conn: Conn
    client: trio.abc.Stream
    broker: trio.abc.Stream
    done: trio.CancelScope  # cancelled when either direction ends
    in_flight: dict[int, _Owed] = field(default_factory=dict)  # by correlation id sent upstream


_Arrival = tuple[float, bytes]  # (trio clock, request frame)


class Relay:
    """A relay on 127.0.0.1:0 to one upstream broker; subclasses override the hooks.

    Usage: `relay = SomeRelay().start()`, then `relay.upstream = (host, port)` before the first
    connection arrives (the broker may need the relay's port before it can start).
    """

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream
        self.port = 0
        self.request_delay_ms = 0.0  # client -> broker, local answers included
        self.response_delay_ms = 0.0  # broker (or relay) -> client
        self._lock = threading.RLock()
        self._problems: list[str] = []
        self._accepted = 0
        self._open = 0
        self._peak_open = 0
        self._held_now = 0
        self._cut = 0
        self._live: dict[int, tuple[trio.CancelScope, trio.abc.Stream]] = {}
        self._released = trio.Event()
        self._released.set()
        self._token: trio.lowlevel.TrioToken | None = None
        self._everything: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._accepting: tuple[trio.CancelScope, trio.SocketListener] | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._crash: BaseException | None = None

    # Hooks (trio thread) -----------------------------------------------------------------

    def on_open(self, conn: Conn) -> None:
        """A client connected (before the relay dials the broker for it)."""

    def on_close(self, conn: Conn) -> None:
        """The connection is over, both sides closed."""

    def on_request(self, conn: Conn, request: Request) -> Decision:
        """What to do with a request, once it is due (after the delay and any hold)."""
        return FORWARD

    def request_hold_ms(self, conn: Conn, request: Request) -> float:
        """Extra ms this one request waits before on_request (a slow path for some requests
        only); the requests after it on its connection wait behind it, in order."""
        return 0.0

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        """The response to write to the client for the broker's answer `frame` to `request`
        (the client's request as received); None writes nothing."""
        return frame

    def takes_raw_frame(self, conn: Conn) -> bool:
        """Whether the client's next frame is a raw SASL token (after SaslHandshake v0) rather
        than a Kafka request; if so, on_raw_frame answers it and nothing reaches the broker."""
        return False

    def on_raw_frame(self, conn: Conn, frame: bytes) -> bytes | None:
        """The raw frame (size prefix included) answering a raw token `frame`; None closes the
        connection, as a broker does on a failed legacy authentication."""
        return None

    # Control (test thread) ---------------------------------------------------------------

    def start(self) -> Self:
        name = type(self).__name__
        self._thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(CONTROL_TIMEOUT) or self._crash is not None:
            raise RuntimeError(f"{name} did not start: {self._crash!r}")
        return self

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def close(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        assert self._everything is not None
        self._call(self._everything.cancel)
        self._thread.join(CONTROL_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError(f"{type(self).__name__} did not stop")

    def problems(self) -> list[str]:
        """Traffic the relay could not read or match, and filter failures (there should be
        none)."""
        with self._lock:
            return list(self._problems)

    def link_counts(self) -> LinkCounts:
        with self._lock:
            return LinkCounts(
                self._accepted, self._open, self._peak_open, self._held_now, self._cut
            )

    def reset_peak(self) -> None:
        """Start a new measuring period: the peak becomes what is open now."""
        with self._lock:
            self._peak_open = self._open

    def hold(self) -> None:
        """Stop forwarding client->broker: requests stay in flight until release() or cut."""
        self._call(self._hold)

    def release(self) -> None:
        self._call(lambda: self._released.set())

    def cut_all(self) -> int:
        """Reset every connection the relay carries (RST to the client, close to the broker).

        Returns how many were cut. New connections are accepted as before.
        """
        return self._call(self._cut_all)

    def stop_accepting(self) -> None:
        """Close the listening socket: a new connection is refused (RST to its SYN), as a
        stopped broker's port is. Connections already carried go on (cut_all ends them)."""
        self._call(self._stop_accepting)

    def accept_again(self) -> None:
        """Listen again, on the same port, after stop_accepting()."""
        self._call(self._accept_again)

    def _call(self, fn: Callable[[], T]) -> T:
        """Run fn in the relay's trio thread and return its result."""
        if self._token is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    # Used by filters (trio thread) -------------------------------------------------------

    def note_problem(self, text: str) -> None:
        with self._lock:
            self._problems.append(text)

    async def carry(self, client: trio.abc.Stream, broker: trio.abc.Stream | None = None) -> None:
        """Carry one connection until either side ends it. The listener passes each accepted
        client and no broker (dial `upstream`); tests may pass two memory streams."""
        with self._lock:
            self._accepted += 1
            self._open += 1
            self._peak_open = max(self._peak_open, self._open)
            conn = Conn(self._accepted, time.monotonic())
        try:
            with trio.CancelScope() as scope:
                self._live[conn.number] = (scope, client)
                with self._failures(conn):
                    self.on_open(conn)
                    if broker is None:
                        broker = await self._dial(conn)
                    if broker is not None:
                        await self._pump(conn, client, broker)
        finally:
            self._live.pop(conn.number, None)
            if broker is not None:
                await trio.aclose_forcefully(broker)
            await trio.aclose_forcefully(client)
            with self._lock:
                self._open -= 1
            with self._failures(conn):
                self.on_close(conn)

    # The relay (trio thread) -------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start() or problems()
            self._crash = exc
            self.note_problem(f"relay crashed: {exc!r}")
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            self._everything = nursery.cancel_scope  # close() cancels it
            self._nursery = nursery
            nursery.start_soon(trio.sleep_forever)  # the relay runs on while not accepting
            self._serve(listeners[0])
            self._ready.set()

    def _serve(self, listener: trio.SocketListener) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._accepting = (scope, listener)
        handlers = self._nursery  # connections outlive a stop_accepting()

        async def serve() -> None:
            with scope, contextlib.suppress(trio.ClosedResourceError):
                await trio.serve_listeners(self.carry, [listener], handler_nursery=handlers)

        self._nursery.start_soon(serve)

    def _stop_accepting(self) -> None:
        if self._accepting is not None:
            scope, listener = self._accepting
            self._accepting = None
            scope.cancel()
            listener.socket.close()  # now, not when the serving task next runs

    def _accept_again(self) -> None:
        if self._accepting is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(socket.SOMAXCONN)
        self._serve(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))

    def _hold(self) -> None:
        if self._released.is_set():
            self._released = trio.Event()

    def _cut_all(self) -> int:
        live = list(self._live.values())
        for scope, client in live:
            if isinstance(client, trio.SocketStream):
                # SO_LINGER 0: close() sends RST, as a failed network path or killed broker would.
                with contextlib.suppress(OSError):
                    linger = struct.pack("ii", 1, 0)
                    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            scope.cancel()
        with self._lock:
            self._cut += len(live)
        return len(live)

    async def _dial(self, conn: Conn) -> trio.SocketStream | None:
        try:
            if self.upstream is None:
                raise OSError(f"{type(self).__name__}.upstream was never set")
            with trio.fail_after(CONNECT_TIMEOUT):
                return await trio.open_tcp_stream(*self.upstream)
        except (OSError, trio.TooSlowError) as exc:
            self.note_problem(f"connection {conn.number}: cannot reach the broker: {exc!r}")
            return None

    async def _pump(self, conn: Conn, client: trio.abc.Stream, broker: trio.abc.Stream) -> None:
        arrived_in, arrived_out = trio.open_memory_channel[_Arrival](math.inf)
        owed_in, owed_out = trio.open_memory_channel[_Owed](math.inf)
        async with trio.open_nursery() as nursery:
            link = _Link(conn, client, broker, nursery.cancel_scope)
            nursery.start_soon(self._read_requests, link, arrived_in)
            nursery.start_soon(self._send_requests, link, arrived_out, owed_in)
            nursery.start_soon(self._read_responses, link)
            nursery.start_soon(self._write_responses, link, owed_out)

    @contextlib.contextmanager
    def _failures(self, conn: Conn, done: trio.CancelScope | None = None) -> Iterator[None]:
        """Any end of one direction ends the connection; what is not a peer leaving is a
        problem (a filter's bug included, with its traceback)."""
        try:
            yield
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except ProtocolError as exc:  # FrameDecoder's or parse_request_header's verdict
            self.note_problem(f"connection {conn.number}: unreadable Kafka: {exc}")
        except Exception as exc:
            self.note_problem(
                f"connection {conn.number}: {type(self).__name__} failed: {exc!r}\n"
                + "".join(traceback.format_exception(exc))
            )
        finally:
            if done is not None:
                done.cancel()

    async def _read_requests(self, link: _Link, arrived: trio.MemorySendChannel[_Arrival]) -> None:
        with self._failures(link.conn, link.done):
            decoder = FrameDecoder()
            while data := await link.client.receive_some(READ_SIZE):
                decoder.receive_data(data)
                for frame in iter(decoder.next_frame, None):
                    arrived.send_nowait((trio.current_time(), frame))

    async def _send_requests(
        self,
        link: _Link,
        arrived: trio.MemoryReceiveChannel[_Arrival],
        owed: trio.MemorySendChannel[_Owed],
    ) -> None:
        with self._failures(link.conn, link.done):
            async for at, frame in arrived:
                # When the request reaches the simulated broker: read, plus the network delay
                # (not when this task gets to it: the thread may have waited for the GIL).
                due = at + self.request_delay_ms / 1000
                if self.request_delay_ms:
                    await trio.sleep_until(due)
                if await self._wait_released():
                    due = trio.current_time()
                if self.takes_raw_frame(link.conn):
                    raw = self.on_raw_frame(link.conn, frame)
                    slot = _Owed(None, close=raw is None)
                    owed.send_nowait(slot)
                    slot.resolve(raw)
                    continue
                request = Request(parse_request_header(frame), frame, due)
                if (extra_ms := self.request_hold_ms(link.conn, request)) > 0:
                    await trio.sleep(extra_ms / 1000)  # later requests on the link wait behind
                    request = Request(request.header, frame, trio.current_time())
                decision = self.on_request(link.conn, request)
                if isinstance(decision, Drop):
                    continue
                slot = _Owed(request, close=isinstance(decision, Close))
                owed.send_nowait(slot)
                if isinstance(decision, Close):
                    slot.resolve(None)
                    await trio.sleep_forever()  # the writer ends the link at this slot
                if isinstance(decision, Answer):
                    slot.resolve(decision.frame)
                    continue
                out = frame if decision.frame is None else decision.frame
                correlation_id = request_correlation_id(out)
                if correlation_id in link.in_flight:
                    self.note_problem(
                        f"connection {link.conn.number}: correlation id {correlation_id} is "
                        "already in flight; the broker's answers could not be told apart"
                    )
                    return
                link.in_flight[correlation_id] = slot  # before the write: the answer finds it
                await link.broker.send_all(out)

    async def _wait_released(self) -> bool:
        """Wait while the client->broker direction is held; True if it was."""
        released = self._released
        if released.is_set():
            return False
        with self._lock:
            self._held_now += 1
        try:
            await released.wait()
        finally:
            with self._lock:
                self._held_now -= 1
        return True

    async def _read_responses(self, link: _Link) -> None:
        with self._failures(link.conn, link.done):
            decoder = FrameDecoder()
            while data := await link.broker.receive_some(READ_SIZE):
                decoder.receive_data(data)
                for frame in iter(decoder.next_frame, None):
                    correlation_id = response_correlation_id(frame)
                    slot = link.in_flight.pop(correlation_id, None)
                    if slot is None or slot.request is None:
                        self.note_problem(
                            f"connection {link.conn.number}: the broker answered correlation "
                            f"id {correlation_id}, which no request in flight has"
                        )
                        return
                    slot.resolve(self.on_response(link.conn, slot.request, frame))

    async def _write_responses(self, link: _Link, owed: trio.MemoryReceiveChannel[_Owed]) -> None:
        with self._failures(link.conn, link.done):
            async for slot in owed:
                await slot.done.wait()
                if self.response_delay_ms:
                    await trio.sleep_until(slot.ready_at + self.response_delay_ms / 1000)
                if slot.frame is not None:
                    await link.client.send_all(slot.frame)
                if slot.close:
                    return
