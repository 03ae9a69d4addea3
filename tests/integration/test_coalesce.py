"""Multi-batch produce (issue 3) end to end: real clients -> kipside -> CountingRelay -> Tansu.

Every test starts its own Tansu that advertises a CountingRelay's port, so kipside (whose
--upstream is the relay) reaches the broker only through the relay, which counts, independently
of kipside, every request and connection kipside makes upstream and records the CRC of every
record batch it forwards. The clients' side is captured on loopback with scapy (client ->
kipside direction only) and reassembled per TCP connection, so what each client sent is known
byte for byte without trusting kipside.

Producers run in separate processes (multiprocessing, spawn) so that many really are
concurrent; each puts "name|seq|" in every value so the log can be checked per producer.

Run: .venv/bin/pytest tests/integration/test_coalesce.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import socket
import struct
import subprocess
import time
import traceback
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    _CHILDREN,  # registered so the hard-deadline watchdog kills our Tansu too
    DIRECT,
    Broker,
    Kipside,
    create_topics,
    start_kipside,
    unique_name,
)
from relays import BatchSeen, CountingRelay, produce_batches

from protocol.apis import ApiKey
from protocol.framing import FrameDecoder
from protocol.headers import parse_request_header
from protocol.records import Compression
from proxy.devbroker import free_port, tansu_path, wait_for_port

pytestmark = pytest.mark.integration

LANES = 2
BROKERS = 1  # Tansu is one node (111)
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
REQUEST_TIMEOUT_MS = 30000
WORKER_DEADLINE = 100.0  # a producer process exits by itself after this, whatever happens
PROCESS_START_TIMEOUT = 60.0  # spawning ~20 interpreters on 2 busy cores is slow
PRODUCE_TIMEOUT = 60.0
CONSUME_TIMEOUT = 60.0
TIMED_OUT_LINE = re.compile(
    r"lane (\d+) to node (\d+) failed \((.*)\): (\d+) batches answered REQUEST_TIMED_OUT"
)


@pytest.fixture(autouse=True)
def _needs_kipside_coalescing() -> None:
    if DIRECT:
        pytest.skip("KIPSIDE_TEST_DIRECT=1: coalescing is kipside's; nothing to test directly")
    if "--one-to-one" in os.environ.get("KIPSIDE_TEST_SERVE_ARGS", ""):
        pytest.skip("kipside runs with --one-to-one: no lanes, no coalescing")


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """Tansu advertising the relay, the relay in front of it, kipside in front of the relay."""

    relay: CountingRelay
    broker: Broker  # bootstrap = the relay: what kipside dials and what Tansu advertises
    broker_port: int  # Tansu's real listener (nothing in the tests dials it)
    kipside: Kipside
    admin_port: int

    def metrics(self) -> dict[str, float]:
        """kipside's /metrics, as {'name{labels}': value}."""
        url = f"http://127.0.0.1:{self.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def _start_tansu_advertising(advertised_port: int) -> tuple[subprocess.Popen[bytes], int]:
    # proxy.devbroker.start_tansu advertises its own port; here clients of the broker must be
    # sent to the relay, so the arguments are built here.
    port = free_port()
    args = [
        str(tansu_path()),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{advertised_port}",
        "--storage-engine",
        "memory://tansu/",
        "--silent",
    ]
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _CHILDREN.append(proc)
    try:
        wait_for_port("127.0.0.1", port)
    except Exception:
        proc.kill()
        raise
    return proc, port


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    relay = CountingRelay().start()
    proc, broker_port = _start_tansu_advertising(relay.port)
    relay.upstream = ("127.0.0.1", broker_port)
    via_relay = Broker(host="127.0.0.1", port=relay.port, pid=proc.pid, proc=proc)
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"coalescing:\n  enabled: true\n  lanes: {LANES}\n  linger_ms: 0\n")
    admin_port = free_port()
    # start_kipside does not pass its extra_args on to `kipside serve`; the environment
    # variable it reads does reach it.
    serve_args = os.environ.get("KIPSIDE_TEST_SERVE_ARGS", "")
    monkeypatch.setenv("KIPSIDE_TEST_SERVE_ARGS", f"{serve_args} --admin 127.0.0.1:{admin_port}")
    kipside: Kipside | None = None
    try:
        kipside = start_kipside(via_relay, tmp_path / "kipside", rules=rules)
        monkeypatch.setenv("KIPSIDE_TEST_SERVE_ARGS", serve_args)
        stdout = kipside.stdout_path.read_text()
        assert f"kipside: admin listening on http://127.0.0.1:{admin_port}" in stdout, stdout
        yield Stack(relay, via_relay, broker_port, kipside, admin_port)
        code = kipside.stop()
        assert code == 0, f"kipside exited with {code} after SIGTERM:\n{kipside.log()[-3000:]}"
    finally:
        if kipside is not None and kipside.proc.poll() is None:
            kipside.proc.kill()
        relay.close()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


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

    class RawLoopbackSocket(L2ListenSocket):  # type: ignore[misc]
        def recv_raw(self, x: int = 0) -> tuple[Any, Any, Any]:
            pkt, sa_ll, ts = self._recv_raw(self.ins, SNAPLEN)
            if sa_ll[2] == socket.PACKET_OUTGOING:
                return None, None, None
            return conf.raw_layer, pkt, ts

    sock = RawLoopbackSocket(iface="lo", nofilter=1)
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

    def stop(self) -> list[ClientRequest]:
        time.sleep(0.3)  # let the last segments reach the socket
        packets = self._sniffer.stop(join=True)
        self.packets, self.drops = _packet_stats(self._sock)
        self._sock.close()
        assert self.drops == 0, f"the kernel dropped {self.drops} of {self.packets} packets"
        return _client_requests(_reassemble(bytes(p.load) for p in packets))


def _reassemble(frames: Iterator[bytes] | Any) -> dict[str, bytes]:
    """Each captured TCP connection's byte stream, in sequence order, holes refused."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    isn: dict[str, int] = {}
    segments: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    for raw in frames:
        packet = Ether(raw)
        if IP not in packet or TCP not in packet:
            continue
        ip, tcp = packet[IP], packet[TCP]
        key = f"{ip.src}:{tcp.sport}->{ip.dst}:{tcp.dport}"
        if tcp.flags.S:
            isn[key] = tcp.seq
        size = ip.len - ip.ihl * 4 - tcp.dataofs * 4
        if size > 0:
            payload = bytes(tcp.payload)[:size]
            assert len(payload) == size, f"{key}: segment cut short ({len(payload)}/{size})"
            segments[key].append((tcp.seq, payload))
    streams = {}
    for key, segs in segments.items():
        assert key in isn, f"{key}: no SYN captured (the capture started too late)"
        out = bytearray()
        for seq, payload in sorted(segs, key=lambda s: (s[0] - isn[key] - 1) % (1 << 32)):
            offset = (seq - isn[key] - 1) % (1 << 32)
            assert offset <= len(out), f"{key}: {offset - len(out)} bytes missing at {len(out)}"
            out += payload[len(out) - offset :]  # retransmissions overlap what we have
        streams[key] = bytes(out)
    return streams


def _client_requests(streams: dict[str, bytes]) -> list[ClientRequest]:
    requests = []
    for key, data in streams.items():
        decoder = FrameDecoder()
        decoder.receive_data(data)
        while (frame := decoder.next_frame()) is not None:
            header = parse_request_header(frame)
            batches: tuple[BatchSeen, ...] = ()
            if header.api_key == ApiKey.PRODUCE:
                batches = tuple(produce_batches(frame))
            requests.append(ClientRequest(key, header.api_key, header.api_version, batches))
        assert decoder.buffered == 0, f"{key}: capture ends inside a frame"
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


def _producer_main(spec: ProducerSpec, bootstrap: str, result: str, ready: Any, go: Any,
                   stop: Any) -> None:  # fmt: skip
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


def _run_confluent(spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any,
                   go: Any, stop: Any) -> None:  # fmt: skip
    import logging

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
    if spec.debug:

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                line = record.getMessage()
                if "timed out" in line.lower() or "Request timed" in line:
                    outcome["log"].append(line)

        logger = logging.getLogger(f"rdkafka.{spec.name}")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(Keep())
        conf["debug"] = spec.debug
        conf["logger"] = logger
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


def _run_kafka_python(spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any,
                      go: Any, stop: Any) -> None:  # fmt: skip
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=spec.name,
        acks="all" if spec.acks == -1 else spec.acks,
        enable_idempotence=spec.idempotent,
        compression_type=None if spec.compression == "none" else spec.compression,
        linger_ms=0,
        batch_size=512,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        max_block_ms=15000,
        **spec.conf,
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
                    [
                        seq,
                        t,
                        p,
                        getattr(exc, "errno", None),
                        type(exc).__name__,
                        bool(getattr(exc, "retriable", False)),
                    ]
                )
            )

        _produce_loop(spec, stop, send)
        producer.flush(timeout=PRODUCE_TIMEOUT)
    finally:
        producer.close(timeout=5)


async def _run_aiokafka(spec: ProducerSpec, bootstrap: str, outcome: dict[str, Any], ready: Any,
                        go: Any, stop: Any) -> None:  # fmt: skip
    import asyncio

    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=spec.name,
        acks="all" if spec.acks == -1 else spec.acks,
        enable_idempotence=spec.idempotent,
        compression_type=None if spec.compression == "none" else spec.compression,
        linger_ms=0,
        max_batch_size=1024,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        **spec.conf,
    )
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
                outcome["delivered"].append([seq, md.topic, md.partition])
            except Exception as exc:
                outcome["failed"].append(
                    [
                        seq,
                        topic,
                        partition,
                        getattr(exc, "errno", None),
                        type(exc).__name__,
                        bool(getattr(exc, "retriable", False)),
                    ]
                )
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
                    [tuple(d) for d in raw["delivered"]],  # type: ignore[misc]
                    [tuple(f) for f in raw["failed"]],  # type: ignore[misc]
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
        got: list[LogRecord] = []
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout
        while len(got) < at_least or len(at_end) < len(targets):
            assert time.monotonic() < deadline, (
                f"read {len(got)}/{at_least} records in {timeout} s; at end: {len(at_end)}"
            )
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            key = (msg.topic(), msg.partition())
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    at_end.add(key)
                    continue
                raise AssertionError(f"consumer error: {err}")
            at_end.discard(key)
            producer, seq = _parse_value(msg.value())
            got.append(LogRecord(producer, seq, key[0], key[1], msg.offset()))
        return got
    finally:
        consumer.close()


def _log_index(records: list[LogRecord]) -> Counter[tuple[str, int]]:
    return Counter((r.producer, r.seq) for r in records)


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
    modes = ("idempotent", "acks=all", "acks=1", "acks=0")
    specs = []
    for i in range(16):
        mode = modes[i % 4]
        acks = {"acks=1": 1, "acks=0": 0}.get(mode, -1)
        specs.append(
            ProducerSpec(
                name=f"ck{i:02d}",
                library="confluent-kafka",
                acks=acks,
                idempotent=mode == "idempotent",
                compression=CODECS[i % len(CODECS)],
                conf={},
                targets=_rotated(targets, i),
                messages=MESSAGES,
                pause_every=8,
                pause=0.002,
            )
        )
    specs.append(
        ProducerSpec(
            name="kp00",
            library="kafka-python",
            acks=-1,
            idempotent=True,
            compression="snappy",
            conf={},
            targets=_rotated(targets, 5),
            messages=MESSAGES,
            pause_every=4,
            pause=0.002,
        )
    )
    specs.append(
        ProducerSpec(
            name="aio00",
            library="aiokafka",
            acks=1,
            idempotent=False,
            compression="zstd",
            conf={},
            targets=_rotated(targets, 7),
            messages=MESSAGES,
            pause_every=4,
            pause=0.002,
        )
    )
    return specs


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
        fleet.go.set()
        outcomes = fleet.join(PRODUCE_TIMEOUT + 30)
    finally:
        fleet.kill()
    after = stack.relay.counts()
    metrics_after = stack.metrics()
    client_requests = capture.stop()

    # Every producer finished and saw every message delivered.
    for o in outcomes:
        assert o.error is None, f"{o.spec.name} crashed:\n{o.error}"
        assert not o.failed, f"{o.spec.name}: {len(o.failed)} failed, first {o.failed[:3]}"
        assert o.undelivered == 0, f"{o.spec.name}: {o.undelivered} never delivered"
        assert len(o.delivered) == o.spec.messages, f"{o.spec.name}: {len(o.delivered)}"

    # Every message (acks=0 ones too: nothing failed here) is in the log exactly once, where
    # its producer sent it, and nothing else is.
    sent = {(o.spec.name, seq): (t, p) for o in outcomes for seq, t, p in o.delivered}
    records = consume_everything(stack.kipside.bootstrap, targets, at_least=len(sent))
    counts = _log_index(records)
    dups = {k: n for k, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} messages duplicated, e.g. {list(dups.items())[:5]}"
    assert set(counts) == set(sent), (
        f"missing {sorted(set(sent) - set(counts))[:10]}, "
        f"unexpected {sorted(set(counts) - set(sent))[:10]}"
    )
    for r in records:
        assert sent[(r.producer, r.seq)] == (r.topic, r.partition), r
    assert_order_per_partition(records, {s.name for s in specs})

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
    produce_label = 'kipside_{}_requests_total{{api="Produce"}}'
    client_metric = metrics_after[produce_label.format("client")] - metrics_before.get(
        produce_label.format("client"), 0
    )
    upstream_metric = metrics_after[produce_label.format("upstream")] - metrics_before.get(
        produce_label.format("upstream"), 0
    )
    relay_upstream = after.requests[ApiKey.PRODUCE] - before.requests[ApiKey.PRODUCE]
    assert len(client_produce) == client_metric, (len(client_produce), client_metric)
    assert relay_upstream == upstream_metric, (relay_upstream, upstream_metric)
    assert relay_upstream < len(client_produce), (relay_upstream, len(client_produce))
    assert upstream_metric < client_metric
    coalesced = metrics_after["kipside_coalesced_batches_total"]
    assert coalesced == len(upstream_batches), (coalesced, len(upstream_batches))

    # Upstream connections. Allowed: LANES per broker node, the shared lanes that carry every
    # ProduceRequest and the short APIs (Metadata, InitProducerId, ...). Producers use no
    # blocking API (Fetch, group APIs), so no client gets a connection of its own, and the
    # admin client that created the topics had closed its own before the producers started.
    # (The checker's consumer, after this, does get one for its Fetches.)
    opened_during = after.accepted - before.accepted
    assert before.open + opened_during <= LANES * BROKERS, (before, after)
    assert after.peak_open <= LANES * BROKERS, after
    assert metrics_after["kipside_upstream_connections"] <= LANES * BROKERS
    produce_connections = [c for c in stack.relay.connections() if c.requests[ApiKey.PRODUCE]]
    assert 1 <= len(produce_connections) <= LANES * BROKERS, produce_connections
    assert metrics_after["kipside_lane_failures_total"] == 0
    print(
        f"\nclients: {len(specs)} producers, {len(client_produce)} ProduceRequests "
        f"({len(client_batches)} batches, {len(sent)} records); upstream: {relay_upstream} "
        f"ProduceRequests on {len(produce_connections)} connections "
        f"(peak open {after.peak_open}, accepted in total {after.accepted}); "
        f"capture: {capture.packets} packets, {capture.drops} dropped"
    )
