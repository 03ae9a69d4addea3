"""Multi-batch produce (issue 3) end to end: real clients -> kipside -> CountingRelay -> Tansu.

Every test starts its own Tansu that advertises a CountingRelay's port, so kipside (whose
--upstream is the relay) reaches the broker only through the relay, which counts, independently
of kipside, every request and connection kipside makes upstream and records the CRC, producer
id, epoch and base sequence of every record batch it forwards. The clients' side is captured on
loopback with scapy (client -> kipside direction only) and read back by kipside.evidence (the
`kipside pcap` reader: TCP reassembled per connection, frames split), so what each client sent
is known byte for byte without trusting kipside's proxy.

Producers run in separate processes (multiprocessing, spawn) so that many really are
concurrent; each puts "name|seq|" in every value so the log can be checked per producer, and
keeps the lines of its client library's log that tell how it saw a connection end.

Tansu answers acks=0 ProduceRequests, Apache Kafka does not: the `stack` fixture's relay
swallows those answers, so the broker behaves as Apache Kafka would; `tansu_stack` passes them
on, to show that kipside copes with Tansu as it is.

- test_many_producers_coalesce_without_loss_or_change: 18 producers (16 confluent-kafka, one
  kafka-python, one aiokafka; idempotent, acks=all/1/0, every codec) on shared partitions:
  everything in the log exactly once and in order, batches byte-identical (CRCs) at the broker,
  fewer upstream than client ProduceRequests, upstream connections within the lanes.
- test_upstream_cut_mid_flight_disconnects_affected_clients_and_loses_nothing: the relay cuts
  every upstream connection under load (once after holding requests in flight, once
  unannounced). kipside closes each client connection that had a batch in flight or queued on a
  cut lane, as a broker disconnect would; the clients see the disconnect (librdkafka and
  aiokafka retry, clients with retries=0 report a retriable connection error), resend in order,
  idempotent ones under the same sequence numbers and epoch: no batch reaches the broker ahead
  of its predecessor, nothing acknowledged is lost, idempotent producers write no duplicates.
- test_lane_cut_closes_the_client_so_no_later_idempotent_batch_overtakes: a hand-driven
  idempotent producer with sequence 0 in flight and 1 queued when the lane dies, and 2 written
  just after: kipside closes the connection without forwarding 1 or 2, and after reconnecting
  the broker sees 0, 1, 2 once each, in order.
- test_acks0_producers_through_kipside_to_tansu_deliver_and_fail_no_lane: acks=0 producers
  (with acks=1 and idempotent ones on the same lanes) against Tansu as it is: kipside drops
  Tansu's answers to acks=0 requests, no lane fails, every message arrives once.

Run: .venv/bin/pytest tests/integration/test_coalesce.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import re
import socket
import struct
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    Kipside,
    create_topics,
    skip_unless_shared_lanes,
    start_kipside,
    unique_name,
)
from relaykit.tansu import tansu_behind
from relays import BatchSeen, CountingRelay, produce_batches
from testkit import tools
from testkit.broker import Broker
from testkit.metrics import Metrics, scrape
from testkit.ports import free_port

from kipside.evidence import kafka_frames
from kipside.protocol.apis import ApiKey
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.records import Compression

from .clients import ck_read_to_end

pytestmark = pytest.mark.integration

LANES = 2
BROKERS = 1  # Tansu is one node (111)
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
REQUEST_TIMEOUT_MS = 30000
WORKER_DEADLINE = 100.0  # a producer process exits by itself after this, whatever happens
PROCESS_START_TIMEOUT = 60.0  # spawning ~20 interpreters on 2 busy cores is slow
PRODUCE_TIMEOUT = 60.0
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
# What a producer process keeps of its client library's log: how it saw the connection end
# and what it did about its batches.
KEPT_CLIENT_LOG = re.compile(
    r"Disconnected|transport failure|Connection lost|Got error produce response|timed out|"
    r"duplicate sequence|out of order|fenc|bump|Produce MessageSet with",
    re.IGNORECASE,
)
# librdkafka (debug "msg"): a ProduceRequest written, and one failed by a lost connection.
RDKAFKA_PRODUCED = re.compile(
    r" (\S+) \[(\d+)\]: Produce MessageSet with \d+ message\(s\) \(.*BaseSeq (\d+), "
    r"PID\{Id:(\d+),Epoch:(\d+)\}"
)
RDKAFKA_TRANSPORT_FAILED = re.compile(
    r" (\S+) \[(\d+)\]: MessageSet with \d+ message\(s\) \(MsgId \d+, BaseSeq (\d+)\) "
    r"encountered error: Local: Broker transport failure"
)


@pytest.fixture(autouse=True)
def _needs_kipside_coalescing() -> None:
    skip_unless_shared_lanes("coalescing")


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
def _stack(tmp_path: Path, *, kafka_acks0: bool) -> Iterator[Stack]:
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


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """The stack with a broker that, like Apache Kafka, never answers acks=0 ProduceRequests:
    Tansu does answer them (kafka-rules.md), and the relay swallows those answers."""
    with _stack(tmp_path, kafka_acks0=True) as s:
        yield s


@pytest.fixture
def tansu_stack(tmp_path: Path) -> Iterator[Stack]:
    """The stack with Tansu as it is: its answers to acks=0 ProduceRequests reach kipside."""
    with _stack(tmp_path, kafka_acks0=False) as s:
        yield s


def _wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- loopback capture

SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_RCVBUFFORCE = 33
SNAPLEN = 1 << 18  # lo's MTU is 65536 and GSO hands whole 64 KiB segments to packet sockets


def _open_loopback_socket(bpf: str) -> Any:
    """A scapy L2ListenSocket on lo that keeps whole packets and copes with bursts.

    scapy compiles filters with a 65535-byte snap length (cutting 64 KiB loopback segments)
    and uses a 64 KiB receive buffer; this socket compiles the filter itself with a larger
    snap length, forces a 64 MiB buffer, skips the duplicate PACKET_OUTGOING copy that lo
    shows of every packet, and hands scapy raw bytes (dissected after the capture).
    """
    tools.require_library("pcap", "the capture compiles its BPF filter with libpcap")
    import ctypes

    from scapy.arch.linux import L2ListenSocket
    from scapy.config import conf
    from scapy.data import DLT_EN10MB, SO_ATTACH_FILTER
    from scapy.libs.structures import bpf_program, sock_fprog
    from scapy.libs.winpcapy import (
        pcap_close,
        pcap_compile,
        pcap_freecode,
        pcap_geterr,
        pcap_open_dead,
    )

    class RawLoopbackSocket(L2ListenSocket):
        def recv_raw(self, x: int = 0) -> tuple[Any, Any, Any]:
            pkt, sa_ll, ts = self._recv_raw(self.ins, SNAPLEN)
            if sa_ll[2] == socket.PACKET_OUTGOING:
                return None, None, None
            return conf.raw_layer, pkt, ts

    # scapy warns that it cannot name lo's link type; the bytes are dissected as Ether later.
    scapy_log = logging.getLogger("scapy.runtime")
    level = scapy_log.level
    scapy_log.setLevel(logging.ERROR)
    try:
        sock = RawLoopbackSocket(iface="lo", nofilter=1)
    finally:
        scapy_log.setLevel(level)
    pcap = pcap_open_dead(DLT_EN10MB, SNAPLEN)
    program = bpf_program()
    try:
        if pcap_compile(pcap, ctypes.byref(program), bpf.encode(), 1, -1) == -1:
            raise RuntimeError(f"bad BPF filter {bpf!r}: {pcap_geterr(pcap)}")
        fprog = sock_fprog(program.bf_len, program.bf_insns)
        sock.ins.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))
        pcap_freecode(ctypes.byref(program))
    finally:
        pcap_close(pcap)
    sock.ins.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    sock.ins.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:  # drop what arrived before the filter was attached
            sock.ins.recv(SNAPLEN)
    sock.ins.setblocking(True)
    _packet_stats(sock)  # reading the statistics resets them
    return sock


def _packet_stats(sock: Any) -> tuple[int, int]:
    """(packets, drops) the kernel counted on the packet socket since the last call."""
    raw = sock.ins.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
    packets, drops = struct.unpack("II", raw)
    return packets, drops


@dataclass(frozen=True)
class ClientRequest:
    connection: str
    api_key: int
    api_version: int
    batches: tuple[BatchSeen, ...]


class ClientCapture:
    """What clients sent to kipside, captured on lo with scapy and reassembled per connection."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self._sock: Any = None
        self._sniffer: Any = None
        self.drops = 0
        self.packets = 0

    def start(self) -> None:
        from scapy.sendrecv import AsyncSniffer

        bpf = "tcp and (" + " or ".join(f"dst port {p}" for p in sorted(self.ports)) + ")"
        self._sock = _open_loopback_socket(bpf)
        self._sniffer = AsyncSniffer(opened_socket=self._sock, store=True)
        self._sniffer.start()

    def stop(self, path: Path) -> list[ClientRequest]:
        """Stop capturing, write what was captured to `path` (pcap) and read it back."""
        from scapy.data import DLT_EN10MB
        from scapy.utils import RawPcapWriter

        time.sleep(0.3)  # let the last segments reach the socket
        packets = self._sniffer.stop(join=True)
        self.packets, self.drops = _packet_stats(self._sock)
        self._sock.close()
        assert self.drops == 0, f"the kernel dropped {self.drops} of {self.packets} packets"
        with RawPcapWriter(str(path), linktype=DLT_EN10MB, snaplen=SNAPLEN) as writer:
            writer.write_header(None)
            for p in packets:
                writer.write_packet(bytes(p.load), sec=int(p.time), usec=int(p.time % 1 * 1e6))
        return _client_requests(path, self.ports)


# Lose nothing: repeated or reordered segments (loopback's tail-loss probes retransmit), and
# answers (the capture holds the client -> kipside direction only).
_NOTHING_LOST_BUT = frozenset({"retransmitted", "overlapping", "out_of_order", "unanswered"})


def _client_requests(capture: Path, ports: set[int]) -> list[ClientRequest]:
    """Every request in the capture, read by kipside.evidence (the `kipside pcap` reader: TCP
    reassembled per connection, frames split); a connection whose SYN was not captured, a
    hole, a segment cut short or a capture ending inside a frame fails the test."""
    requests = []
    frames = kafka_frames(capture, ports)
    for frame in frames:
        assert not frame.is_response and not frame.damaged, frame
        batches: tuple[BatchSeen, ...] = ()
        if frame.api_key == ApiKey.PRODUCE:
            batches = tuple(produce_batches(frame.data))
        connection = f"{frame.client}->{frame.server}"
        requests.append(ClientRequest(connection, frame.api_key, frame.api_version, batches))
    lost = {why: n for why, n in frames.skipped.items() if n and why not in _NOTHING_LOST_BUT}
    assert not lost, f"{capture}: the capture lacks bytes: {lost}"
    return requests


# --------------------------------------------------------------------------- producer processes


@dataclass(frozen=True)
class ProducerSpec:
    name: str
    library: str  # confluent-kafka | kafka-python | aiokafka
    acks: int  # -1 = all
    idempotent: bool
    compression: str
    conf: dict[str, Any]
    targets: tuple[tuple[str, int], ...]  # (topic, partition), used round robin
    messages: int  # how many, or the most if running until told to stop
    pause_every: int = 0  # sleep `pause` s after every `pause_every` messages (0: never)
    pause: float = 0.0
    debug: str = ""  # confluent-kafka debug contexts whose log lines are kept


def _value(name: str, seq: int) -> bytes:
    head = f"{name}|{seq:07d}|".encode()
    return head + b"kipside-coalesce-" * (4 + seq % 7)  # compressible, varied sizes


def _parse_value(value: bytes) -> tuple[str, int]:
    name, seq, _ = value.split(b"|", 2)
    return name.decode(), int(seq)


def _target(spec: ProducerSpec, seq: int) -> tuple[str, int]:
    return spec.targets[seq % len(spec.targets)]


def _producer_main(
    spec: ProducerSpec, bootstrap: str, result: str, ready: Any, go: Any, stop: Any
) -> None:
    """Entry point of a producer process: produce, then write what happened to `result`."""
    import threading

    # Whatever happens in here, the process must not outlive the test.
    threading.Timer(WORKER_DEADLINE, os._exit, args=(7,)).start()
    outcome: dict[str, Any] = {"delivered": [], "failed": [], "undelivered": 0, "log": []}
    try:
        runner = {"confluent-kafka": _run_confluent, "kafka-python": _run_kafka_python}
        if spec.library == "aiokafka":
            import asyncio

            asyncio.run(_run_aiokafka(spec, bootstrap, outcome, ready, go, stop))
        else:
            runner[spec.library](spec, bootstrap, outcome, ready, go, stop)
    except BaseException:
        outcome["error"] = traceback.format_exc()
    Path(result).write_text(json.dumps(outcome))
    os._exit(0)


def _produce_loop(spec: ProducerSpec, stop: Any, send: Any) -> None:
    for seq in range(spec.messages):
        if stop.is_set():
            return
        send(seq)
        if spec.pause_every and seq % spec.pause_every == spec.pause_every - 1:
            time.sleep(spec.pause)


def _keep_client_log(outcome: dict[str, Any], logger_name: str) -> logging.Logger:
    """Keep the client library's log lines that KEPT_CLIENT_LOG matches in outcome["log"]."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = record.getMessage()
            if KEPT_CLIENT_LOG.search(line):
                outcome["log"].append(f"{record.levelname} {record.name}: {line}")

    logger = logging.getLogger(logger_name)
    # librdkafka's debug lines are wanted; kafka-python's and aiokafka's are far too many.
    logger.setLevel(logging.DEBUG if logger_name.startswith("rdkafka.") else logging.INFO)
    logger.addHandler(Keep())
    return logger


def _run_confluent(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    import confluent_kafka as ck

    conf = {
        "bootstrap.servers": bootstrap,
        "client.id": spec.name,
        "linger.ms": 0,
        "batch.num.messages": 4,  # many small ProduceRequests (librdkafka: one per partition)
        "compression.codec": spec.compression,
        "request.timeout.ms": REQUEST_TIMEOUT_MS,
        "message.timeout.ms": 60000,
        "socket.timeout.ms": 10000,
        "enable.idempotence": spec.idempotent,
        "acks": "all" if spec.acks == -1 else str(spec.acks),
        **spec.conf,
    }
    # librdkafka's own log (errors always, debug contexts if asked for), filtered.
    conf["logger"] = _keep_client_log(outcome, f"rdkafka.{spec.name}")
    if spec.debug:
        conf["debug"] = spec.debug
    producer = ck.Producer(conf)

    def on_delivery(err: Any, msg: Any) -> None:
        _, seq = _parse_value(msg.value())
        if err is None:
            outcome["delivered"].append([seq, msg.topic(), msg.partition()])
        else:
            outcome["failed"].append(
                [seq, msg.topic(), msg.partition(), err.code(), err.name(), err.retriable()]
            )

    producer.list_topics(timeout=15)
    ready.set()
    go.wait(PROCESS_START_TIMEOUT)

    def send(seq: int) -> None:
        topic, partition = _target(spec, seq)
        while True:
            try:
                producer.produce(
                    topic, _value(spec.name, seq), partition=partition, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)

    _produce_loop(spec, stop, send)
    outcome["undelivered"] = producer.flush(PRODUCE_TIMEOUT)


def _python_producer_conf(spec: ProducerSpec, bootstrap: str, **extra: Any) -> dict[str, Any]:
    """kafka-python's and aiokafka's producer settings for a spec (they take the same names)."""
    return {
        "bootstrap_servers": bootstrap,
        "client_id": spec.name,
        "acks": "all" if spec.acks == -1 else spec.acks,
        "enable_idempotence": spec.idempotent,
        "compression_type": None if spec.compression == "none" else spec.compression,
        "linger_ms": 0,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        **extra,
        **spec.conf,
    }


def _failure(seq: int, topic: str, partition: int, exc: BaseException) -> list[Any]:
    """A failed send as the outcome records it: kafka-python's and aiokafka's errors alike."""
    errno, retriable = getattr(exc, "errno", None), bool(getattr(exc, "retriable", False))
    return [seq, topic, partition, errno, type(exc).__name__, retriable]


def _run_kafka_python(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    from kafka import KafkaProducer

    _keep_client_log(outcome, "kafka")
    producer = KafkaProducer(
        **_python_producer_conf(spec, bootstrap, batch_size=512, max_block_ms=15000)
    )
    try:
        for topic in {t for t, _ in spec.targets}:
            producer.partitions_for(topic)
        ready.set()
        go.wait(PROCESS_START_TIMEOUT)

        def send(seq: int) -> None:
            topic, partition = _target(spec, seq)
            future = producer.send(topic, value=_value(spec.name, seq), partition=partition)
            future.add_callback(
                lambda md, seq=seq: outcome["delivered"].append([seq, md.topic, md.partition])
            )
            future.add_errback(
                lambda exc, seq=seq, t=topic, p=partition: outcome["failed"].append(
                    _failure(seq, t, p, exc)
                )
            )

        _produce_loop(spec, stop, send)
        producer.flush(timeout=PRODUCE_TIMEOUT)
    finally:
        producer.close(timeout=5)


async def _run_aiokafka(
    spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any, go: Any, stop: Any
) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    _keep_client_log(outcome, "aiokafka")
    producer = AIOKafkaProducer(**_python_producer_conf(spec, bootstrap, max_batch_size=1024))
    await producer.start()
    try:
        for topic in {t for t, _ in spec.targets}:
            await producer.partitions_for(topic)
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, PROCESS_START_TIMEOUT)
        futures = []
        for seq in range(spec.messages):
            if stop.is_set():
                break
            topic, partition = _target(spec, seq)
            future = await producer.send(topic, _value(spec.name, seq), partition=partition)
            futures.append((seq, topic, partition, future))
            if spec.pause_every and seq % spec.pause_every == spec.pause_every - 1:
                await asyncio.sleep(spec.pause)
        await asyncio.wait_for(producer.flush(), PRODUCE_TIMEOUT)
        for seq, topic, partition, future in futures:
            try:
                md = await future
                if md is None:  # acks=0: aiokafka reports it sent, with no metadata
                    outcome["delivered"].append([seq, topic, partition])
                else:
                    outcome["delivered"].append([seq, md.topic, md.partition])
            except Exception as exc:
                outcome["failed"].append(_failure(seq, topic, partition, exc))
    finally:
        await producer.stop()


@dataclass
class Outcome:
    spec: ProducerSpec
    delivered: list[tuple[int, str, int]]
    failed: list[tuple[int, str, int, Any, str, bool]]
    undelivered: int
    log: list[str]
    error: str | None

    def assert_all_delivered(self) -> None:
        """The producer finished and saw every message delivered."""
        name = self.spec.name
        assert self.error is None, f"{name} crashed:\n{self.error}"
        assert not self.failed, f"{name}: {len(self.failed)} failed, first {self.failed[:3]}"
        assert self.undelivered == 0, f"{name}: {self.undelivered} never delivered"
        assert len(self.delivered) == self.spec.messages, f"{name}: {len(self.delivered)}"


class ProducerFleet:
    """Producer processes started together: ready, go, (stop), results."""

    def __init__(self, specs: list[ProducerSpec], bootstrap: str, workdir: Path) -> None:
        self.specs = specs
        self.bootstrap = bootstrap
        self.workdir = workdir
        ctx = multiprocessing.get_context("spawn")
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.ready = [ctx.Event() for _ in specs]
        self.results = [workdir / f"producer-{spec.name}.json" for spec in specs]
        self.processes = [
            ctx.Process(
                target=_producer_main,
                args=(spec, bootstrap, str(path), ready, self.go, self.stop),
                name=spec.name,
                daemon=True,
            )
            for spec, path, ready in zip(specs, self.results, self.ready, strict=True)
        ]

    def start(self) -> None:
        """Start every process and wait until each has metadata; they then wait for go()."""
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + PROCESS_START_TIMEOUT
        for spec, ready, process in zip(self.specs, self.ready, self.processes, strict=True):
            while not ready.wait(0.2):
                if not process.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(
                        f"producer {spec.name} not ready: {self._result_text(spec.name)}"
                    )

    def _result_text(self, name: str) -> str:
        path = self.workdir / f"producer-{name}.json"
        return path.read_text()[-2000:] if path.exists() else "(no result written)"

    def join(self, timeout: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
        hung = [p.name for p in self.processes if p.is_alive()]
        assert not hung, f"producers still running after {timeout} s: {hung}"
        outcomes = []
        for spec, path in zip(self.specs, self.results, strict=True):
            assert path.exists(), f"producer {spec.name} wrote no result"
            raw = json.loads(path.read_text())
            outcomes.append(
                Outcome(
                    spec,
                    [(d[0], d[1], d[2]) for d in raw["delivered"]],
                    [(f[0], f[1], f[2], f[3], f[4], f[5]) for f in raw["failed"]],
                    raw["undelivered"],
                    raw["log"],
                    raw.get("error"),
                )
            )
        return outcomes

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


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
            producer, seq = _parse_value(msg.value() or b"")
            where = (str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            got.append(LogRecord(producer, seq, *where))
        return got
    finally:
        consumer.close()


def _log_index(records: list[LogRecord]) -> Counter[tuple[str, int]]:
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
    counts = _log_index(records)
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


def _targets(topics: list[str], partitions: int) -> list[tuple[str, int]]:
    return [(t, p) for t in topics for p in range(partitions)]


def _rotated(targets: list[tuple[str, int]], by: int) -> tuple[tuple[str, int], ...]:
    by %= len(targets)
    return tuple(targets[by:] + targets[:by])


def _wait_for_idle_upstream(stack: Stack, timeout: float = 15.0) -> None:
    """Wait until only kipside's lanes are open upstream (the topic-creating admin client's
    own connection has gone), so the produce phase starts from a known set of connections."""
    _wait_until(
        lambda: stack.relay.counts().open <= LANES * BROKERS,
        timeout,
        f"upstream connections to drop to {LANES * BROKERS}: {stack.relay.counts()}",
    )


# --------------------------------------------------------------------------- tests

TOPICS = 3
PARTITIONS = 4
MESSAGES = 240


def _fleet_specs(targets: list[tuple[str, int]]) -> list[ProducerSpec]:
    # (acks, idempotent) by turn: idempotent, acks=all, acks=1, acks=0
    modes = [(-1, True), (-1, False), (1, False), (0, False)]
    # name, library, acks, idempotent, compression, turn of the targets, pause every N messages
    rows = [
        (f"ck{i:02d}", "confluent-kafka", *modes[i % 4], CODECS[i % len(CODECS)], i, 8)
        for i in range(16)
    ]
    rows += [
        ("kp00", "kafka-python", -1, True, "snappy", 5, 4),
        ("aio00", "aiokafka", 1, False, "zstd", 7, 4),
    ]
    return [
        ProducerSpec(
            name, lib, acks, idem, codec, {}, _rotated(targets, turn), MESSAGES, every, 0.002
        )
        for name, lib, acks, idem, codec, turn, every in rows
    ]


def test_many_producers_coalesce_without_loss_or_change(
    stack: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topics = [unique_name(f"co{t}", request) for t in range(TOPICS)]
    create_topics(stack.kipside.bootstrap, topics, PARTITIONS)
    targets = _targets(topics, PARTITIONS)
    specs = _fleet_specs(targets)
    assert len(specs) >= 18
    assert {s.compression for s in specs} == set(CODECS)

    capture = ClientCapture(stack.kipside.ports)
    capture.start()
    fleet = ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    try:
        fleet.start()  # every producer has its metadata (and producer id, if idempotent)
        _wait_for_idle_upstream(stack)
        before = stack.relay.counts()
        metrics_before = stack.metrics()
        stack.relay.reset_peak()
        produce_started = time.monotonic()
        fleet.go.set()
        outcomes = fleet.join(PRODUCE_TIMEOUT + 30)
    finally:
        fleet.kill()
    after = stack.relay.counts()
    connections = stack.relay.connections()  # before the checker's consumer adds its own
    metrics_after = stack.metrics()
    client_requests = capture.stop(tmp_path / "clients.pcap")

    # Every producer finished and saw every message delivered.
    for o in outcomes:
        o.assert_all_delivered()

    # Every message (acks=0 ones too: nothing failed here) is in the log exactly once, where
    # its producer sent it, and nothing else is.
    sent = {(o.spec.name, seq): (t, p) for o in outcomes for seq, t, p in o.delivered}
    records = assert_logged_once(stack.kipside.bootstrap, targets, set(sent), specs)
    for r in records:
        assert sent[(r.producer, r.seq)] == (r.topic, r.partition), r

    # The batches arrived unchanged: what the clients sent (captured on lo) is, CRC for CRC
    # and partition for partition, what kipside forwarded to the broker (seen by the relay).
    client_produce = [r for r in client_requests if r.api_key == ApiKey.PRODUCE]
    client_batches = [b for r in client_produce for b in r.batches]
    upstream_batches = stack.relay.batches()
    assert all(b.crc_valid for b in client_batches)
    assert all(b.crc_valid for b in upstream_batches), "kipside changed a batch's bytes"
    assert stack.relay.problems() == []
    client_crcs = Counter((b.topic, b.partition, b.crc) for b in client_batches)
    upstream_crcs = Counter((b.topic, b.partition, b.crc) for b in upstream_batches)
    assert client_crcs == upstream_crcs, (
        f"only sent by clients: {list((client_crcs - upstream_crcs).items())[:5]}; "
        f"only upstream: {list((upstream_crcs - client_crcs).items())[:5]}"
    )
    assert sum(b.records_count for b in client_batches) == len(sent)
    codecs_seen = {Compression(b.compression).name.lower() for b in upstream_batches}
    assert codecs_seen == set(CODECS), codecs_seen
    assert {b.acks for b in upstream_batches} == {-1, 0, 1}

    # Fewer requests upstream than clients sent, by kipside's count and by independent ones
    # (the capture for the clients' side, the relay for the broker's side).
    def produce_requests(side: str) -> float:
        name = f"kipside_{side}_requests_total"
        after = metrics_after.value(name, api="Produce")
        return after - metrics_before.value(name, 0.0, api="Produce")

    client_metric = produce_requests("client")
    upstream_metric = produce_requests("upstream")
    relay_upstream = after.requests[ApiKey.PRODUCE] - before.requests[ApiKey.PRODUCE]
    assert len(client_produce) == client_metric, (len(client_produce), client_metric)
    assert relay_upstream == upstream_metric, (relay_upstream, upstream_metric)
    assert relay_upstream < len(client_produce), (relay_upstream, len(client_produce))
    assert upstream_metric < client_metric
    coalesced = metrics_after.value("kipside_coalesced_batches_total")
    assert coalesced == len(upstream_batches), (coalesced, len(upstream_batches))

    # Upstream connections. While the 18 producers ran, only LANES per broker node were open:
    # the shared lanes, which carry every ProduceRequest and the short APIs (ApiVersions,
    # Metadata, InitProducerId, GetTelemetrySubscriptions). Producers use no blocking API
    # (Fetch, group APIs), so none gets a connection of its own. Before that, the relay carried
    # exactly two others, both closed before the producers started: kipside's start-up
    # discovery (one Metadata request) and the connection of the admin client that created the
    # topics (CreateTopics is not a short API, so it went on that client's own connection).
    # The checker's consumer, afterwards, gets one for its Fetches: not counted here.
    opened_during = after.accepted - before.accepted
    assert before.open + opened_during <= LANES * BROKERS, (before, after)
    assert after.peak_open <= LANES * BROKERS, after
    assert metrics_after.value("kipside_upstream_connections") <= LANES * BROKERS
    produce_connections = [c for c in connections if c.requests[ApiKey.PRODUCE]]
    assert 1 <= len(produce_connections) <= LANES * BROKERS, produce_connections
    others = sorted(
        (sorted(c.requests.items()), c.closed_at is not None and c.closed_at < produce_started)
        for c in connections
        if not c.requests[ApiKey.PRODUCE]
    )
    assert others == [([(ApiKey.METADATA, 1)], True), ([(ApiKey.CREATE_TOPICS, 1)], True)], others
    assert metrics_after.value("kipside_lane_failures_total") == 0
    print(
        f"\nclients: {len(specs)} producers, {len(client_produce)} ProduceRequests "
        f"({len(client_batches)} batches, {len(sent)} records); upstream: {relay_upstream} "
        f"ProduceRequests on {len(produce_connections)} connections "
        f"(peak open {after.peak_open}, accepted in total {after.accepted}); "
        f"capture: {capture.packets} packets, {capture.drops} dropped"
    )


def _cut_specs(targets: list[tuple[str, int]]) -> list[ProducerSpec]:
    endless: dict[str, Any] = {"conf": {}, "messages": 1_000_000, "pause_every": 2, "pause": 0.004}
    no_retry = {**endless, "conf": {"retries": 0}}  # until told to stop, either way
    rows: list[tuple[str, str, int, bool, str, int, dict[str, Any]]] = [
        # name, library, acks, idempotent, compression, rotation of the targets, the rest
        ("idem-lz4", "confluent-kafka", -1, True, "lz4", 0, {**endless, "debug": "msg"}),
        ("idem-zstd", "confluent-kafka", -1, True, "zstd", 3, {**endless, "debug": "msg"}),
        ("all-gzip", "confluent-kafka", -1, False, "gzip", 5, endless),
        ("ck-noretry", "confluent-kafka", 1, False, "none", 2, no_retry),
        ("kp-noretry", "kafka-python", 1, False, "gzip", 6, no_retry),
        ("aio-acks1", "aiokafka", 1, False, "snappy", 1, endless),
    ]
    return [
        ProducerSpec(name, lib, acks, idem, codec, targets=_rotated(targets, turn), **rest)
        for name, lib, acks, idem, codec, turn, rest in rows
    ]


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


def test_upstream_cut_mid_flight_disconnects_affected_clients_and_loses_nothing(
    stack: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topics = [unique_name(f"cut{t}", request) for t in range(2)]
    create_topics(stack.kipside.bootstrap, topics, PARTITIONS)
    targets = _targets(topics, PARTITIONS)
    specs = _cut_specs(targets)
    names = {s.name for s in specs}
    fleet = ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    relay = stack.relay
    try:
        fleet.start()
        fleet.go.set()
        start = relay.counts().requests[ApiKey.PRODUCE]
        _wait_until(
            lambda: relay.counts().requests[ApiKey.PRODUCE] > start + 50, 30, "produce traffic"
        )
        mark = stack.kipside.log_mark()
        accepted_before_cut = relay.counts().accepted
        # Hold what kipside sends upstream so that requests are certainly in flight on the
        # lanes (and more queue behind them, from every producer), then cut every connection.
        relay.hold()
        _wait_until(lambda: relay.counts().held_now >= 1, 10, "a request held in flight")
        time.sleep(0.5)
        first_cut = relay.cut_all()
        relay.release()
        assert stack.kipside.wait_for_log(LANE_FAILED_LINE.search, mark, timeout=10), (
            f"kipside logged no lane failure:\n{stack.kipside.log()[-3000:]}"
        )
        time.sleep(1.5)  # producers carry on over re-dialled lanes...
        second_cut = relay.cut_all()  # ...and lose them again, this time with no warning
        time.sleep(1.5)
        fleet.stop.set()
        outcomes = {o.spec.name: o for o in fleet.join(PRODUCE_TIMEOUT + 30)}
    finally:
        fleet.kill()
    stack.kipside.assert_alive()
    metrics = stack.metrics()

    # kipside closed the client connections that had a batch in flight or queued on a cut
    # lane, and said so: per lane, and per client connection.
    assert first_cut >= 1 and second_cut >= 1, (first_cut, second_cut)
    log = stack.kipside.log_since(mark).splitlines()
    lane_lines = [m for ln in log if (m := LANE_FAILED_LINE.search(ln))]
    assert lane_lines, f"no lane failure in kipside's log:\n{stack.kipside.log()[-3000:]}"
    assert all(int(m.group(2)) == 111 for m in lane_lines), [m.group(0) for m in lane_lines]
    closed_per_lane = [int(m.group(5)) for m in lane_lines]
    assert sum(closed_per_lane) > 0, [m.group(0) for m in lane_lines]
    for m in lane_lines:
        batches, closed = int(m.group(4)), int(m.group(5))
        # Connections, not requests: at most one per producer (each has one to node 111).
        assert 1 <= closed <= min(batches, len(specs)), m.group(0)
    client_lines = [m for ln in log if (m := CLIENT_CLOSED_LINE.search(ln))]
    short_api_lines = [m for ln in log if (m := CLOSED_FOR_SHORT_API_LINE.search(ln))]
    assert client_lines, "kipside named no client connection it closed"
    assert len(client_lines) <= sum(closed_per_lane), (len(client_lines), closed_per_lane)
    assert all(m.group(4) == "111" for m in client_lines), [m.group(0) for m in client_lines]
    closed_for_batches = Counter(m.group(2) for m in client_lines)
    closed_at_all = closed_for_batches + Counter(m.group(2) for m in short_api_lines)
    assert set(closed_at_all) <= names, closed_at_all
    assert metrics.value("kipside_lane_failures_total") >= 1
    assert relay.counts().accepted > accepted_before_cut, "kipside never re-dialled its lanes"
    assert metrics.value("kipside_upstream_connections") <= LANES * BROKERS

    for o in outcomes.values():
        assert o.error is None, f"{o.spec.name} crashed:\n{o.error}"
        assert o.undelivered == 0, f"{o.spec.name}: {o.undelivered} never reported"
        assert o.delivered, f"{o.spec.name} delivered nothing"

    # Each client whose connection kipside closed saw a disconnect, as from a broker.
    for name in closed_at_all:
        if outcomes[name].spec.library == "confluent-kafka":
            assert any("Disconnected" in ln for ln in outcomes[name].log), (
                f"{name}: librdkafka logged no disconnect: {outcomes[name].log[:5]}"
            )
    # Clients that do not retry saw a retriable error for the batches that were in flight.
    kp_errors = Counter((f[3], f[4], f[5]) for f in outcomes["kp-noretry"].failed)
    if closed_for_batches["kp-noretry"]:
        assert kp_errors[(None, "KafkaConnectionError", True)] > 0, kp_errors
        assert any("Connection lost" in ln for ln in outcomes["kp-noretry"].log)
    assert all(f[5] for f in outcomes["kp-noretry"].failed), outcomes["kp-noretry"].failed[:5]
    # librdkafka's delivery report says retriable() False once its retries (0 here) are spent;
    # the code is its local transport failure, which librdkafka retries when it may (the
    # idempotent producers' resends below).
    ck_errors = Counter((f[3], f[4]) for f in outcomes["ck-noretry"].failed)
    if closed_for_batches["ck-noretry"]:
        assert ck_errors[(-195, "_TRANSPORT")] > 0, ck_errors
    assert set(ck_errors) <= {(-195, "_TRANSPORT")}, ck_errors
    # Clients that retry got everything through after the disconnect.
    if closed_for_batches["aio-acks1"]:
        lost_connection = "Got error produce response: KafkaConnectionError"
        aio_log = outcomes["aio-acks1"].log
        assert any(lost_connection in ln for ln in aio_log), aio_log[:5]
    for name in ("all-gzip", "aio-acks1", "idem-lz4", "idem-zstd"):
        assert not outcomes[name].failed, (name, outcomes[name].failed[:5])

    # The idempotent producers resent, on their new connection, every batch the disconnect
    # failed, under the same sequence number and epoch: librdkafka's own log.
    resends = {}
    for name in ("idem-lz4", "idem-zstd"):
        lines = list(enumerate(outcomes[name].log))
        produced = [(i, m.groups()) for i, ln in lines if (m := RDKAFKA_PRODUCED.search(ln))]
        failed = [(i, m.groups()) for i, ln in lines if (m := RDKAFKA_TRANSPORT_FAILED.search(ln))]
        if closed_for_batches[name]:
            assert failed, f"{name}: librdkafka logged no batch failed by the disconnect"
        assert {g[4] for _, g in produced} == {"0"}, f"{name} bumped its epoch"
        for i, batch in failed:
            resent_after = [j for j, g in produced if j > i and g[:3] == batch]
            assert resent_after, f"{name}: {batch} (topic, partition, sequence) never resent"
        resends[name] = len(failed)

    # The broker never saw a batch ahead of its predecessor (no OUT_OF_ORDER_SEQUENCE_NUMBER,
    # hence no epoch bump and no fencing), whatever was resent.
    upstream = relay.batches()
    gaps, resent = sequence_gaps(upstream)
    assert not gaps, gaps[:10]
    idempotent_batches = [b for b in upstream if b.producer_id >= 0]
    assert {b.producer_epoch for b in idempotent_batches} == {0}

    # Nothing acknowledged was lost; idempotent producers wrote nothing twice, in order.
    delivered = {(o.spec.name, seq) for o in outcomes.values() for seq, _, _ in o.delivered}
    records = consume_everything(stack.kipside.bootstrap, targets, at_least=len(delivered))
    counts = _log_index(records)
    lost = sorted(delivered - set(counts))
    assert not lost, f"{len(lost)} acknowledged messages are not in the log: {lost[:10]}"
    idempotent = {s.name for s in specs if s.idempotent}
    dups = {k: n for k, n in counts.items() if k[0] in idempotent and n > 1}
    assert not dups, f"idempotent producers' duplicates: {list(dups.items())[:10]}"
    assert_order_per_partition(records, idempotent)
    print(
        f"\ncuts: {first_cut} + {second_cut} connections; kipside: "
        + "; ".join(
            f"lane {m.group(1)}: {m.group(4)} batches, {m.group(5)} clients" for m in lane_lines
        )
        + f"; closed for batches {dict(closed_for_batches)}, for short APIs "
        f"{dict(Counter(m.group(2) for m in short_api_lines))}; client errors: kafka-python "
        f"{dict(kp_errors)}, confluent {dict(ck_errors)}; idempotent batches failed by the "
        f"disconnect and resent {resends}; resent upstream {resent} of "
        f"{len(idempotent_batches)}; delivered {len(delivered)}, in log {len(records)}"
    )


# --------------------------------------------------------------------------- one raw producer


class RawIdempotentProducer:
    """A hand-driven idempotent producer on one kipside connection: exact control over which
    request is written when, which real clients do not give."""

    def __init__(self, address: tuple[str, int], topic: str) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=10)
        self.topic = topic
        self.decoder = FrameDecoder()
        self.correlation_id = 0
        self.producer_id = -1
        self.epoch = -1

    def close(self) -> None:
        self.sock.close()

    def reconnect(self) -> None:
        """A new connection, same producer id and epoch (what a client does after a disconnect)."""
        self.sock.close()
        self.sock = socket.create_connection(self.address, timeout=10)
        self.decoder = FrameDecoder()

    def wait_closed(self, timeout: float) -> str:
        """Read until the peer closes the connection; fail if anything is answered instead."""
        self.sock.settimeout(timeout)
        try:
            while data := self.sock.recv(65536):
                self.decoder.receive_data(data)
                frame = self.decoder.next_frame()
                assert frame is None, f"answered instead of closed: {bytes(frame[:16])!r}"
        except ConnectionResetError:
            return "reset"
        finally:
            self.sock.settimeout(10)
        return "closed"

    def send(self, api_key: int, version: int, body: bytes) -> int:
        from kipside.protocol.headers import build_frame, encode_request_header

        self.correlation_id += 1
        header = encode_request_header(api_key, version, self.correlation_id, "raw-idempotent")
        self.sock.sendall(build_frame(header, body))
        return self.correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> bytes:
        from kipside.protocol.headers import parse_response_header

        while (frame := self.decoder.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "kipside closed the connection"
            self.decoder.receive_data(data)
        header = parse_response_header(frame, api_key, version)
        assert header.correlation_id == correlation_id, (header, correlation_id)
        return frame[header.body_offset :]

    def init_producer_id(self) -> None:
        # v4 (Tansu answers v0/v1 with UNKNOWN_SERVER_ERROR): null transactional id, timeout,
        # no current producer id/epoch, no tagged fields.
        body = b"\x00" + struct.pack(">iqh", 60000, -1, -1) + b"\x00"
        correlation_id = self.send(ApiKey.INIT_PRODUCER_ID, 4, body)
        frame = self.receive(ApiKey.INIT_PRODUCER_ID, 4, correlation_id)
        _throttle, error, self.producer_id, self.epoch = struct.unpack_from(">ihqh", frame)
        assert error == 0, f"InitProducerId failed with {error}"

    def produce(self, sequence: int) -> int:
        """Write a one-record batch with this base sequence, acks=all; return the correlation id."""
        from kafka.record.default_records import DefaultRecordBatchBuilder

        from kipside.protocol.produce import PartitionBatch, encode_produce_request

        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            batch_size=1 << 20,
        )
        builder.append(
            0,
            timestamp=int(time.time() * 1000),
            key=None,
            value=_value("raw", sequence),
            headers=[],
        )
        batch = PartitionBatch(self.topic, 0, memoryview(bytes(builder.build())))
        chunks = encode_produce_request(9, acks=-1, timeout_ms=10000, partitions=[batch])
        return self.send(ApiKey.PRODUCE, 9, b"".join(bytes(c) for c in chunks))

    def produce_result(self, correlation_id: int) -> int:
        from kipside.protocol.produce import parse_produce_response

        body = self.receive(ApiKey.PRODUCE, 9, correlation_id)
        header_size = 8  # parse_produce_response reads from a frame: put the prefix back
        response = parse_produce_response(b"\x00" * header_size + body, header_size, 9)
        (result,) = response.partitions
        return result.error_code


def _client_produce_requests(stack: Stack) -> float:
    return stack.metrics().value("kipside_client_requests_total", 0.0, api="Produce")


def test_lane_cut_closes_the_client_so_no_later_idempotent_batch_overtakes(
    stack: Stack, request: pytest.FixtureRequest
) -> None:
    """Sequence 0 is in flight on a lane when the lane dies, sequence 1 is queued behind it
    (pipelined), and the client writes sequence 2 just after the failure, before it can know.
    A broker connection that dies takes all three with it, so the client resends 0, 1, 2 in
    order on a new connection. Through kipside likewise: kipside closes the client connection,
    so neither 1 nor 2 reaches the broker ahead of 0's resend. (Answering the failed batches
    with an error instead let sequence 2 overtake: the broker saw [1, 0, 1] or [2, 0, ...],
    answered OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumped its epoch.)"""
    topic = unique_name("gap", request)
    create_topics(stack.kipside.bootstrap, [topic], 1)
    relay = stack.relay
    producer = RawIdempotentProducer(("127.0.0.1", stack.kipside.node_ports[111]), topic)
    try:
        producer.init_producer_id()
        produce_requests = _client_produce_requests(stack)
        relay.hold()
        producer.produce(0)
        _wait_until(lambda: relay.counts().held_now >= 1, 10, "sequence 0 held in flight")
        producer.produce(1)  # pipelined: queued on the lane behind 0
        _wait_until(
            lambda: _client_produce_requests(stack) >= produce_requests + 2,
            10,
            "kipside to read sequence 1",
        )
        mark = stack.kipside.log_mark()
        relay.cut_all()
        relay.release()
        lane_lines = stack.kipside.wait_for_log(LANE_FAILED_LINE.search, mark, timeout=10)
        assert lane_lines, f"no lane failure logged:\n{stack.kipside.log()[-3000:]}"
        with contextlib.suppress(OSError):  # kipside may have closed the socket already
            producer.produce(2)  # written after kipside failed the lane
        how = producer.wait_closed(timeout=10)
        # Nothing of this producer reached the broker since the cut: 0 died held in the relay,
        # 1 and 2 never left kipside.
        before_resend = [b for b in relay.batches() if b.producer_id == producer.producer_id]
        # What the client then does: reconnect and resend, in order, under the same sequences.
        producer.reconnect()
        resent = [producer.produce(sequence) for sequence in (0, 1, 2)]
        results = [producer.produce_result(correlation_id) for correlation_id in resent]
    finally:
        producer.close()
    log = stack.kipside.log_since(mark).splitlines()
    lanes = [m for ln in log if (m := LANE_FAILED_LINE.search(ln))]
    assert [(int(m.group(4)), int(m.group(5))) for m in lanes] == [(2, 1)], lane_lines
    closed = [m for ln in log if (m := CLIENT_CLOSED_LINE.search(ln))]
    assert [(m.group(2), m.group(4)) for m in closed] == [("raw-idempotent", "111")], closed
    assert how in ("closed", "reset"), how
    assert before_resend == [], before_resend
    assert results == [0, 0, 0], results
    ours = [b for b in relay.batches() if b.producer_id == producer.producer_id]
    assert [b.base_sequence for b in ours] == [0, 1, 2], [b.base_sequence for b in ours]
    assert {b.producer_epoch for b in ours} == {producer.epoch}
    assert sequence_gaps(ours) == ([], 0)
    records = consume_everything(stack.kipside.bootstrap, [(topic, 0)], at_least=3)
    assert [r.seq for r in sorted(records, key=lambda r: r.offset)] == [0, 1, 2], records
    assert stack.metrics().value("kipside_lane_failures_total") >= 1
    print(
        f"\nkipside: {lanes[0].group(0)}; client connection {how}; broker saw sequences "
        f"{[b.base_sequence for b in ours]}"
    )


ACKS0_MESSAGES = 300


def test_acks0_producers_through_kipside_to_tansu_deliver_and_fail_no_lane(
    tansu_stack: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Tansu answers acks=0 ProduceRequests (Apache Kafka does not). kipside drops those
    answers: every acks=0 producer's messages arrive, and no lane is taken down by them, even
    with acks=1 and idempotent producers sharing the lanes (an answer nobody asked for arrives
    while the lane waits for one it did ask for)."""
    stack = tansu_stack
    topics = [unique_name(f"a0{t}", request) for t in range(2)]
    create_topics(stack.kipside.bootstrap, topics, PARTITIONS)
    targets = _targets(topics, PARTITIONS)
    common: dict[str, Any] = {
        "conf": {},
        "messages": ACKS0_MESSAGES,
        "pause_every": 8,
        "pause": 0.002,
    }
    rows = [  # name, library, acks, idempotent, compression, rotation of the targets
        ("a0-ck-lz4", "confluent-kafka", 0, False, "lz4", 0),
        ("a0-ck-none", "confluent-kafka", 0, False, "none", 3),
        ("a0-kp-gzip", "kafka-python", 0, False, "gzip", 5),
        ("a0-aio-zstd", "aiokafka", 0, False, "zstd", 6),
        ("a1-ck-snappy", "confluent-kafka", 1, False, "snappy", 1),
        ("idem-ck-zstd", "confluent-kafka", -1, True, "zstd", 2),
    ]
    specs = [
        ProducerSpec(name, lib, acks, idem, codec, targets=_rotated(targets, turn), **common)
        for name, lib, acks, idem, codec, turn in rows
    ]
    mark = stack.kipside.log_mark()
    fleet = ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    try:
        fleet.start()
        _wait_for_idle_upstream(stack)
        accepted_before = stack.relay.counts().accepted
        fleet.go.set()
        outcomes = fleet.join(PRODUCE_TIMEOUT + 30)
    finally:
        fleet.kill()
    stack.kipside.assert_alive()
    counts = stack.relay.counts()  # before the checker's consumer adds its own connection
    metrics = stack.metrics()
    for o in outcomes:
        o.assert_all_delivered()
    # No answer nobody asked for took a lane down (kipside dropped each), none was re-dialled.
    assert metrics.value("kipside_lane_failures_total") == 0
    assert counts.accepted == accepted_before, (accepted_before, counts)
    log = stack.kipside.log_since(mark)
    assert not LANE_FAILED_LINE.search(log), log[-3000:]
    assert "correlation id" not in log, log[-3000:]
    assert stack.relay.problems() == []
    # Every message is in the log exactly once, in order.
    sent = {(o.spec.name, seq) for o in outcomes for seq, _, _ in o.delivered}
    records = assert_logged_once(stack.kipside.bootstrap, targets, sent, specs)
    # Tansu did answer kipside's acks=0 requests, every one, and the relay swallowed none.
    counts = stack.relay.counts()
    assert counts.acks0_requests > 0 and counts.swallowed_acks0_responses == 0, counts
    assert counts.acks0_answers == counts.acks0_requests, counts
    print(
        f"\nacks=0 requests upstream {counts.acks0_requests}, answered by Tansu "
        f"{counts.acks0_answers}, dropped by kipside; {len(records)} records in the log"
    )
