"""A fault-injecting test relay that simulates Apache Kafka's marker-writing window after EndTxn.

Apache Kafka answers EndTxn once PrepareCommit/PrepareAbort is logged, then writes the markers;
until they are written, the coordinator answers the transactional id's next AddPartitionsToTxn
and AddOffsetsToTxn with CONCURRENT_TRANSACTIONS (kafka-rules.md, "Transactions"). Tansu 0.6.0
has no such window. MarkerWindowRelay sits between kipside and a dedicated Tansu and adds it:
for `window_ms` after each successful EndTxn response for a transactional id, it answers that
id's AddPartitionsToTxn (v0-3: every requested partition gets error 51) and AddOffsetsToTxn
(error 51) itself, and forwards everything else unchanged. It is a SIMULATION of the real
broker's behaviour, in front of the real (Tansu) broker.

It is Kafka-frame aware in both directions: requests are read whole, responses are matched to
the requests they answer by correlation id, and a local answer is queued behind every response
still owed on its connection, so each connection's responses stay in request order (clients
and kipside require that). Local answers use the request's API version, header version and
correlation id.

Independently of kipside it counts, per transactional id: forwarded ("accepted") and locally
rejected AddPartitionsToTxn / AddOffsetsToTxn, and EndTxn (with the broker's answer), as an
ordered event list so a test can count per transaction (the events between two EndTxns).

A second, optional simulation: Apache Kafka fails a whole AddPartitionsToTxn that names a topic
it doesn't know (UNKNOWN_TOPIC_OR_PARTITION for that topic's partitions, OPERATION_NOT_ATTEMPTED
for the others); Tansu 0.6.0 accepts any topic name there. Topics in `unknown_topics` are
refused that way by the relay (counted as "refused", never forwarded).

`delay_ms` adds a one-way delay to each direction (so a round trip through the relay costs
2 * delay_ms more): a way to give the simulated broker a network RTT. Frames keep their order.

It runs trio in a background thread; the public methods are called from the test's thread.
It binds and dials loopback only. start_tansu_advertising() starts the Tansu to put behind it
(the broker must advertise the relay's address, or clients would bypass the relay).
"""

from __future__ import annotations

import datetime
import math
import subprocess
import threading
import time
import typing
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.framing import FrameDecoder
from protocol.headers import (
    RequestHeader,
    build_frame,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    response_correlation_id,
)
from protocol.messages import decode_request, decode_response, encode_message, response_class
from proxy.devbroker import free_port, tansu_path, wait_for_port

LOOPBACK: Final = "127.0.0.1"
CONNECT_TIMEOUT: Final = 5.0
CONTROL_TIMEOUT: Final = 10.0
READ_SIZE: Final = 256 * 1024
CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)  # 51
MAX_V3_ADD_PARTITIONS: Final = 3  # v4+ is the broker-to-broker batch form: forwarded as is

UNKNOWN_TOPIC_OR_PARTITION: Final = int(ErrorCode.unknown_topic_or_partition)  # 3
OPERATION_NOT_ATTEMPTED: Final = int(ErrorCode.operation_not_attempted)  # 55

ADD_PARTITIONS: Final = "AddPartitionsToTxn"
ADD_OFFSETS: Final = "AddOffsetsToTxn"
END_TXN: Final = "EndTxn"
ACCEPTED: Final = "accepted"  # forwarded to the broker
REJECTED: Final = "rejected"  # answered CONCURRENT_TRANSACTIONS by the relay (in a window)
REFUSED: Final = "refused"  # answered UNKNOWN_TOPIC_OR_PARTITION by the relay (unknown_topics)
_KINDS: Final[dict[int, str]] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: ADD_PARTITIONS,
    ApiKey.ADD_OFFSETS_TO_TXN: ADD_OFFSETS,
    ApiKey.END_TXN: END_TXN,
}


@dataclass(frozen=True, slots=True)
class TxnEvent:
    """One transactional request that passed (or was stopped by) the relay."""

    at: float  # time.monotonic()
    kind: str  # ADD_PARTITIONS, ADD_OFFSETS or END_TXN
    outcome: str  # ACCEPTED, REJECTED or REFUSED (END_TXN: always ACCEPTED)
    error_code: int | None = None  # END_TXN: the broker's answer; else the relay's, or None
    committed: bool | None = None  # END_TXN: commit or abort
    partitions: tuple[tuple[str, int], ...] = ()  # ADD_PARTITIONS: what was asked for
    group: str | None = None  # ADD_OFFSETS


@dataclass(frozen=True, slots=True)
class TxnSegment:
    """What the relay saw for one transaction of one id: the events up to its EndTxn."""

    accepted_add_partitions: int
    rejected_add_partitions: int
    refused_add_partitions: int
    accepted_add_offsets: int
    rejected_add_offsets: int
    end: TxnEvent | None  # None: the transaction had not ended (yet)


@dataclass(frozen=True, slots=True)
class TxnCounts:
    """A consistent copy of the relay's counters (all transactional ids together)."""

    accepted_add_partitions: int
    rejected_add_partitions: int
    refused_add_partitions: int
    accepted_add_offsets: int
    rejected_add_offsets: int
    end_txn: int
    end_txn_ok: int
    forwarded: Counter[int]  # every forwarded request, by API key
    local_answers: int
    connections: int


@dataclass(slots=True)
class _Slot:
    """One response owed to the client side of a connection, in request order."""

    correlation_id: int
    api_key: int
    api_version: int
    done: trio.Event = field(default_factory=trio.Event)
    frame: bytes | None = None
    ready_at: float = 0.0  # trio clock: when the (simulated) broker sent it
    end_txn: tuple[str, bool] | None = None  # (transactional id, committed) for EndTxn


class MarkerWindowRelay:
    """Relay on 127.0.0.1:0 to one broker, answering CONCURRENT_TRANSACTIONS in the window.

    Usage: `relay = MarkerWindowRelay(window_ms=50).start()`, start the broker advertising
    `relay.port`, then set `relay.upstream = (host, broker_port)` before the first connection.
    `window_ms`, `delay_ms` and `unknown_topics` may be changed while traffic flows.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | None = None,
        *,
        window_ms: float = 50.0,
        delay_ms: float = 0.0,
        unknown_topics: Iterable[str] = (),
    ) -> None:
        self.upstream = upstream
        self.window_ms = window_ms
        self.delay_ms = delay_ms
        self.unknown_topics = frozenset(unknown_topics)
        self.port = 0
        self._lock = threading.Lock()
        self._events: dict[str, list[TxnEvent]] = {}
        self._window_until: dict[str, float] = {}  # trio clock
        self._forwarded: Counter[int] = Counter()
        self._local_answers = 0
        self._connections = 0
        self._problems: list[str] = []
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._crash: BaseException | None = None

    # Control (test thread) --------------------------------------------------------------

    def start(self) -> MarkerWindowRelay:
        self._thread = threading.Thread(
            target=self._thread_main, name="MarkerWindowRelay", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(CONTROL_TIMEOUT) or self._crash is not None:
            raise RuntimeError(f"MarkerWindowRelay did not start: {self._crash!r}")
        return self

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def events(self, transactional_id: str) -> list[TxnEvent]:
        with self._lock:
            return list(self._events.get(transactional_id, ()))

    def transactional_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._events)

    def segments(self, transactional_id: str) -> list[TxnSegment]:
        """Per transaction (events split after each EndTxn the broker answered without error):
        the accepted and rejected adds, and the EndTxn that ended it."""
        out: list[TxnSegment] = []
        counts: Counter[tuple[str, str]] = Counter()
        for event in self.events(transactional_id):
            if event.kind != END_TXN:
                counts[event.kind, event.outcome] += 1
                continue
            if event.error_code != 0:
                continue  # the transaction did not end
            out.append(_segment(counts, event))
            counts = Counter()
        if counts:
            out.append(_segment(counts, None))
        return out

    def counts(self) -> TxnCounts:
        with self._lock:
            every = [e for events in self._events.values() for e in events]
            kinds = Counter((e.kind, e.outcome) for e in every)
            return TxnCounts(
                accepted_add_partitions=kinds[ADD_PARTITIONS, ACCEPTED],
                rejected_add_partitions=kinds[ADD_PARTITIONS, REJECTED],
                refused_add_partitions=kinds[ADD_PARTITIONS, REFUSED],
                accepted_add_offsets=kinds[ADD_OFFSETS, ACCEPTED],
                rejected_add_offsets=kinds[ADD_OFFSETS, REJECTED],
                end_txn=kinds[END_TXN, ACCEPTED],
                end_txn_ok=sum(1 for e in every if e.kind == END_TXN and e.error_code == 0),
                forwarded=Counter(self._forwarded),
                local_answers=self._local_answers,
                connections=self._connections,
            )

    def problems(self) -> list[str]:
        """Frames the relay could not read or match (there should be none)."""
        with self._lock:
            return list(self._problems)

    def open_window(self, transactional_id: str, window_ms: float) -> None:
        """Start a window for an id now, as if an EndTxn had just been answered."""
        assert self._token is not None

        def start() -> None:
            self._window_until[transactional_id] = trio.current_time() + window_ms / 1000

        trio.from_thread.run_sync(start, trio_token=self._token)

    def close(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        assert self._token is not None and self._stop is not None
        stop = self._stop
        trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join(CONTROL_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("MarkerWindowRelay did not stop")

    # The relay (trio thread) ------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start() or problems()
            self._crash = exc
            with self._lock:
                self._problems.append(f"relay crashed: {exc!r}")
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._carry, listeners)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _carry(self, client: trio.SocketStream) -> None:
        with self._lock:
            self._connections += 1
            number = self._connections
        broker: trio.SocketStream | None = None
        try:
            if self.upstream is None:
                raise OSError("MarkerWindowRelay.upstream was never set")
            with trio.fail_after(CONNECT_TIMEOUT):
                broker = await trio.open_tcp_stream(*self.upstream)
            requests_in, requests_out = trio.open_memory_channel[tuple[float, bytes]](math.inf)
            slots_in, slots_out = trio.open_memory_channel[_Slot](math.inf)
            awaiting: deque[_Slot] = deque()  # forwarded, not yet answered by the broker
            async with trio.open_nursery() as nursery:
                done = nursery.cancel_scope
                nursery.start_soon(self._read_client, client, requests_in, number, done)
                nursery.start_soon(
                    self._forward, requests_out, slots_in, awaiting, broker, number, done
                )
                nursery.start_soon(self._read_broker, broker, awaiting, number, done)
                nursery.start_soon(self._write_client, slots_out, client, done)
        except (OSError, trio.TooSlowError) as exc:
            self._problem(f"connection {number}: cannot reach the broker: {exc!r}")
        finally:
            if broker is not None:
                await trio.aclose_forcefully(broker)
            await trio.aclose_forcefully(client)

    async def _read_client(
        self,
        client: trio.SocketStream,
        requests: trio.MemorySendChannel[tuple[float, bytes]],
        number: int,
        done: trio.CancelScope,
    ) -> None:
        decoder = FrameDecoder()
        try:
            while data := await client.receive_some(READ_SIZE):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    requests.send_nowait((trio.current_time(), frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except ProtocolError as exc:
            self._problem(f"connection {number}: client sent bytes that are not Kafka: {exc}")
        done.cancel()

    async def _forward(
        self,
        requests: trio.MemoryReceiveChannel[tuple[float, bytes]],
        slots: trio.MemorySendChannel[_Slot],
        awaiting: deque[_Slot],
        broker: trio.SocketStream,
        number: int,
        done: trio.CancelScope,
    ) -> None:
        try:
            async for arrived, frame in requests:
                await trio.sleep_until(arrived + self.delay_ms / 1000)
                try:
                    header = parse_request_header(frame)
                except ProtocolError as exc:
                    self._problem(f"connection {number}: bad request header: {exc}")
                    break
                slot = _Slot(header.correlation_id, header.api_key, header.api_version)
                local = self._local_answer(header, frame, slot, number)
                if local is not None:
                    slot.frame, slot.ready_at = local, trio.current_time()
                    slot.done.set()
                    slots.send_nowait(slot)
                    continue
                with self._lock:
                    self._forwarded[header.api_key] += 1
                # Registered before the write, so the broker's answer always finds its slot.
                awaiting.append(slot)
                slots.send_nowait(slot)
                await broker.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def _local_answer(
        self, header: RequestHeader, frame: bytes, slot: _Slot, number: int
    ) -> bytes | None:
        """Classify a request; return the relay's own answer if it is in a window, else None."""
        kind = _KINDS.get(header.api_key)
        if kind is None:
            return None
        if kind == ADD_PARTITIONS and header.api_version > MAX_V3_ADD_PARTITIONS:
            return None
        try:
            request = decode_request(header.api_key, header.api_version, frame, header.body_offset)
        except ProtocolError as exc:
            self._problem(f"connection {number}: unreadable {kind} request: {exc}")
            return None
        now = trio.current_time()
        if kind == END_TXN:
            slot.end_txn = (str(request.transactional_id), bool(request.committed))
            return None
        if kind == ADD_PARTITIONS:
            txn_id = str(request.v3_and_below_transactional_id)
            partitions = tuple(
                (str(t.name), int(p)) for t in request.v3_and_below_topics for p in t.partitions
            )
            group = None
        else:
            txn_id = str(request.transactional_id)
            partitions = ()
            group = str(request.group_id)
        unknown = {t for t, _ in partitions} & self.unknown_topics
        if unknown:
            # Apache Kafka checks the topics before the coordinator sees the request.
            outcome, code = REFUSED, UNKNOWN_TOPIC_OR_PARTITION
            answer = _add_partitions_answer(
                header,
                request,
                lambda topic: (
                    UNKNOWN_TOPIC_OR_PARTITION if topic in unknown else OPERATION_NOT_ATTEMPTED
                ),
            )
        elif now < self._window_until.get(txn_id, -math.inf):
            outcome, code = REJECTED, CONCURRENT_TRANSACTIONS
            if kind == ADD_PARTITIONS:
                answer = _add_partitions_answer(header, request, lambda _: CONCURRENT_TRANSACTIONS)
            else:
                answer = _add_offsets_answer(header, CONCURRENT_TRANSACTIONS)
        else:
            outcome, code, answer = ACCEPTED, None, None
        self._record(
            txn_id,
            TxnEvent(time.monotonic(), kind, outcome, code, partitions=partitions, group=group),
        )
        if answer is not None:
            with self._lock:
                self._local_answers += 1
        return answer

    async def _read_broker(
        self,
        broker: trio.SocketStream,
        awaiting: deque[_Slot],
        number: int,
        done: trio.CancelScope,
    ) -> None:
        decoder = FrameDecoder()
        try:
            while data := await broker.receive_some(READ_SIZE):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    if not awaiting:
                        self._problem(f"connection {number}: a response nobody asked for")
                        done.cancel()
                        return
                    slot = awaiting.popleft()
                    got = response_correlation_id(frame)
                    if got != slot.correlation_id:
                        self._problem(
                            f"connection {number}: response correlation id {got}, expected "
                            f"{slot.correlation_id}"
                        )
                        done.cancel()
                        return
                    if slot.end_txn is not None:
                        self._end_txn(slot, frame, number)
                    slot.frame, slot.ready_at = frame, trio.current_time()
                    slot.done.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except ProtocolError as exc:
            self._problem(f"connection {number}: broker sent bytes that are not Kafka: {exc}")
        done.cancel()

    def _end_txn(self, slot: _Slot, frame: bytes, number: int) -> None:
        assert slot.end_txn is not None
        txn_id, committed = slot.end_txn
        try:
            header = parse_response_header(frame, slot.api_key, slot.api_version)
            response = decode_response(slot.api_key, slot.api_version, frame, header.body_offset)
            code = int(response.error_code)
        except ProtocolError as exc:
            self._problem(f"connection {number}: unreadable EndTxn response: {exc}")
            return
        if code == 0:
            # The coordinator now "writes markers" for window_ms.
            self._window_until[txn_id] = trio.current_time() + self.window_ms / 1000
        self._record(
            txn_id,
            TxnEvent(time.monotonic(), END_TXN, ACCEPTED, error_code=code, committed=committed),
        )

    async def _write_client(
        self,
        slots: trio.MemoryReceiveChannel[_Slot],
        client: trio.SocketStream,
        done: trio.CancelScope,
    ) -> None:
        try:
            async for slot in slots:
                await slot.done.wait()
                await trio.sleep_until(slot.ready_at + self.delay_ms / 1000)
                assert slot.frame is not None
                await client.send_all(slot.frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def _record(self, txn_id: str, event: TxnEvent) -> None:
        with self._lock:
            self._events.setdefault(txn_id, []).append(event)

    def _problem(self, text: str) -> None:
        with self._lock:
            self._problems.append(text)


def _segment(counts: Counter[tuple[str, str]], end: TxnEvent | None) -> TxnSegment:
    return TxnSegment(
        accepted_add_partitions=counts[ADD_PARTITIONS, ACCEPTED],
        rejected_add_partitions=counts[ADD_PARTITIONS, REJECTED],
        refused_add_partitions=counts[ADD_PARTITIONS, REFUSED],
        accepted_add_offsets=counts[ADD_OFFSETS, ACCEPTED],
        rejected_add_offsets=counts[ADD_OFFSETS, REJECTED],
        end=end,
    )


# --------------------------------------------------------------------------- local answers

_ZERO: Final = datetime.timedelta(0)


def _element_class(cls: type, name: str) -> Any:
    """The element class of a tuple-of-entities field of a kio message class."""
    hint = typing.get_type_hints(cls)[name]
    while typing.get_origin(hint) is not tuple:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_args(hint)[0]


def _add_partitions_answer(
    header: RequestHeader, request: Any, error_for: Callable[[str], int]
) -> bytes:
    """AddPartitionsToTxn v0-3: every requested partition, in request order, with
    error_for(topic)."""
    cls = response_class(header.api_key, header.api_version)
    topic_cls = _element_class(cls, "results_by_topic_v3_and_below")
    partition_cls = _element_class(topic_cls, "results_by_partition")
    message = cls(
        throttle_time=i32Timedelta.parse(_ZERO),
        results_by_topic_v3_and_below=tuple(
            topic_cls(
                name=topic.name,
                results_by_partition=tuple(
                    partition_cls(
                        partition_index=i32(int(p)),
                        partition_error_code=ErrorCode(error_for(str(topic.name))),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.v3_and_below_topics
        ),
    )
    return _response_frame(header, message)


def _add_offsets_answer(header: RequestHeader, code: int) -> bytes:
    cls = response_class(header.api_key, header.api_version)
    message = cls(throttle_time=i32Timedelta.parse(_ZERO), error_code=ErrorCode(code))
    return _response_frame(header, message)


def _response_frame(header: RequestHeader, message: Any) -> bytes:
    head = encode_response_header(header.api_key, header.api_version, header.correlation_id)
    return build_frame(head, encode_message(message))


def start_tansu_advertising(advertised_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start an in-memory Tansu on a free loopback port that advertises 127.0.0.1:advertised_port
    (the relay's) as its address; returns the process and its real port once it listens."""
    port = free_port()
    args = [
        str(tansu_path()),
        "broker",
        "--listener-url",
        f"tcp://{LOOPBACK}:{port}",
        "--advertised-listener-url",
        f"tcp://{LOOPBACK}:{advertised_port}",
        "--storage-engine",
        "memory://tansu/",
        "--silent",
    ]
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(LOOPBACK, port)
    except Exception:
        proc.kill()
        proc.wait(timeout=5)
        raise
    return proc, port
