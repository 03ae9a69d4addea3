"""What the several-brokers tests share: kipside in front of a simulated 3-node cluster, leader
moves in the background, concurrent producers of each client library, and what the simulated
nodes recorded about kipside's upstream traffic.

`cluster_stack()` starts a relaykit.cluster.SimulatedCluster (ONE Tansu presented as nodes 1,
2, 3: see that module) and `kipside serve --upstream NODE1,NODE2,NODE3` in front of it, with the
admin endpoint on (its metrics count what clients sent). Everything is bounded: producers
flush within FLUSH_TIMEOUT, the mover stops when told, kipside must exit 0 on SIGTERM, and the
simulation must have noted no problem.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import psutil
from relaykit.cluster import NodeRecord, SimulatedCluster, simulated_cluster
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import scrape
from testkit.ports import free_port

from .clients import FLUSH_TIMEOUT, Msg, run_async
from .clients_aiokafka import aio_common
from .clients_confluent import ck_config
from .clients_kafka_python import kp_producer, kp_send

NODES = (1, 2, 3)
PARTITIONS = 6  # two per node: partition P starts on node NODES[P % 3]
CHUNK = 10  # messages a producer sends between two pauses
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
# aiokafka cannot be idempotent on Tansu 0.6.0 (InitProducerId v0: tests/integration/tansu_bugs)
IDEMPOTENT = {"confluent-kafka": True, "kafka-python": True, "aiokafka": False}


@dataclass
class ClusterStack:
    cluster: SimulatedCluster
    kipside: Kipside
    admin_port: int

    @property
    def bootstrap(self) -> str:
        self.kipside.assert_alive()
        return self.kipside.bootstrap

    def metric(self, name: str, **labels: str) -> float:
        """kipside's own count, from its /metrics (0 if it has no such sample yet)."""
        return scrape(self.admin_port).value(name, 0.0, **labels)

    def client_requests(self, api: str) -> float:
        """What clients sent kipside so far."""
        return self.metric("kipside_client_requests_total", api=api)


@contextmanager
def cluster_stack(
    workdir: Path, rules: str = "", nodes: Sequence[int] = NODES
) -> Iterator[ClusterStack]:
    """kipside (with this rule file text) in front of a fresh simulated cluster of `nodes`."""
    workdir.mkdir(parents=True, exist_ok=True)
    rule_file = workdir / "rules.yaml"
    rule_file.write_text(rules)
    admin = free_port()
    with simulated_cluster(nodes) as cluster:
        ks = start_kipside(
            cluster,
            workdir,
            rules=rule_file,
            extra_args=["--admin", f"127.0.0.1:{admin}"],
            nodes=nodes,
        )
        try:
            yield ClusterStack(cluster, ks, admin)
        finally:
            code = ks.stop()
            assert code == 0, f"kipside exited with {code}; log:\n{ks.log()[-3000:]}"
            assert not cluster.problems(), cluster.problems()


# --------------------------------------------------------------------------- what nodes saw


@dataclass(frozen=True)
class TopicTraffic:
    """One topic's upstream produce traffic per node, between two snapshots of the records."""

    produce_requests: Counter[int]  # node -> ProduceRequests forwarded carrying the topic
    partitions: dict[int, set[int]]  # node -> partitions whose batches it forwarded
    refused: Counter[int]  # node -> partitions of the topic it refused
    producers_per_request: dict[int, int]  # node -> most producer ids in one request

    def total_requests(self) -> int:
        return sum(self.produce_requests.values())


def topic_traffic(
    before: dict[int, NodeRecord], after: dict[int, NodeRecord], topic: str
) -> TopicTraffic:
    requests: Counter[int] = Counter()
    refused: Counter[int] = Counter()
    partitions: dict[int, set[int]] = {}
    producers: dict[int, int] = {}
    for node, record in after.items():
        seen = record.produce[len(before[node].produce) if node in before else 0 :]
        for request in seen:
            mine = [b for b in request.batches if b.topic == topic]
            refused[node] += sum(1 for t, _ in request.refused if t == topic)
            if not mine:
                continue
            requests[node] += 1
            partitions.setdefault(node, set()).update(b.partition for b in mine)
            ids = {b.producer_id for b in mine}
            producers[node] = max(producers.get(node, 0), len(ids))
    return TopicTraffic(requests, partitions, refused, producers)


def refusals(
    before: dict[int, NodeRecord], after: dict[int, NodeRecord], api: int, error: int
) -> int:
    """How many times (partitions or requests) the nodes refused `api` with `error`."""
    return sum(
        record.refused[(api, error)] - (before[n].refused[(api, error)] if n in before else 0)
        for n, record in after.items()
    )


def served(before: dict[int, NodeRecord], after: dict[int, NodeRecord], api: int) -> set[int]:
    """The nodes that received `api` requests between the snapshots."""
    return {
        n
        for n, record in after.items()
        if record.requests[api] > (before[n].requests[api] if n in before else 0)
    }


# --------------------------------------------------------------------------- leader moves


@dataclass
class Mover:
    """Moves the leaders of a topic's partitions, one at a time, to the next live node, every
    `interval` s while running (a background thread); `also` runs after each move (e.g. to move
    a coordinator too). At each move it also looks at this process's sockets: a client that
    learned a node's own address (from an answer kipside failed to rewrite) would be connected
    to it; `bypassed` lists any such connection."""

    cluster: SimulatedCluster
    topic: str
    interval: float = 0.15
    also: Callable[[int], None] | None = None
    moves: int = 0
    bypassed: set[tuple[str, int]] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Mover:
        self._thread = threading.Thread(target=self._run, name="leader-mover", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        assert not self._thread.is_alive(), "the leader mover did not stop"

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            move_next(self.cluster, self.topic, self.moves % PARTITIONS)
            self.moves += 1
            if self.also is not None:
                self.also(self.moves)
            self.bypassed |= connections_to(self.cluster)


def connections_to(cluster: SimulatedCluster) -> set[tuple[str, int]]:
    """This process's TCP connections to the simulated nodes themselves (clients must reach
    them only through kipside)."""
    ports = {cluster.port(n) for n in cluster.nodes()}
    return {
        (c.raddr.ip, c.raddr.port)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port in ports
    }


def move_next(cluster: SimulatedCluster, topic: str, partition: int) -> int:
    """Move a partition's leader to the next live node; returns the new leader."""
    live = cluster.nodes()
    leader, _ = cluster.leader(topic, partition)
    target = live[(live.index(leader) + 1) % len(live)] if leader in live else live[0]
    cluster.move_leader(topic, partition, target)
    return target


# --------------------------------------------------------------------------- producers


class Background:
    """Runs fn() in a thread; join() waits (bounded) and raises what it raised."""

    def __init__(self, fn: Callable[[], None], timeout: float = FLUSH_TIMEOUT + 60) -> None:
        self._timeout = timeout
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            self._error.append(exc)

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(self._timeout)
        assert not self._thread.is_alive(), f"still running after {self._timeout} s"
        if self._error:
            raise self._error[0]


def produce_concurrently(
    client: str, bootstrap: str, topic: str, sends: dict[str, list[Msg]], pause: float = 0.0
) -> None:
    """One producer of `client` per entry of `sends`, all at once, each sending its messages
    in chunks of CHUNK with `pause` s between chunks; asserts every delivery succeeded.
    Idempotent where the client can be on Tansu (IDEMPOTENT), acks=all, linger 5 ms. Each
    producer's first chunk is delivered before any sends the rest (its connections and
    producer id are ready: the producers then really overlap)."""
    if client == "aiokafka":
        run_async(_aio_all(bootstrap, topic, sends, pause), timeout=FLUSH_TIMEOUT + 30)
        return
    one = _ck_one if client == "confluent-kafka" else _kp_one
    paced = _Paced(pause, threading.Barrier(len(sends), timeout=30))
    threads = [
        threading.Thread(target=one, args=(bootstrap, topic, msgs, paced), daemon=True)
        for msgs in sends.values()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(FLUSH_TIMEOUT + 30)
    assert not any(t.is_alive() for t in threads), "a producer did not finish"
    errors = paced.errors
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"


def _chunks(msgs: list[Msg]) -> Iterator[list[Msg]]:
    for i in range(0, len(msgs), CHUNK):
        yield msgs[i : i + CHUNK]


@dataclass
class _Paced:
    """What the producer threads of produce_concurrently share: the pause after each chunk, the
    barrier where every producer's first chunk, delivered, waits for the others', the errors."""

    pause: float
    start: threading.Barrier
    errors: list[str] = field(default_factory=list)

    def chunks(self, msgs: list[Msg], flush: Callable[[], object]) -> Iterator[list[Msg]]:
        """`msgs` in chunks of CHUNK for the caller to send; the first is flushed and waits at
        the barrier before the rest go."""
        for n, chunk in enumerate(_chunks(msgs)):
            yield chunk
            if n == 0:
                flush()
                self.start.wait()
            time.sleep(self.pause)

    def failed(self, exc: Exception) -> None:
        """The producer gave up: its error, and the barrier broken so no other waits for it."""
        self.errors.append(repr(exc))
        self.start.abort()


def _ck_one(bootstrap: str, topic: str, msgs: list[Msg], paced: _Paced) -> None:
    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            paced.errors.append(str(err))

    conf = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
    p = ck.Producer(ck_config(bootstrap, **conf, **{"message.timeout.ms": 20000}))
    try:
        for chunk in paced.chunks(msgs, lambda: p.flush(FLUSH_TIMEOUT)):
            for m in chunk:
                p.produce(
                    topic,
                    m.value,
                    m.key,
                    partition=m.partition,
                    headers=list(m.headers),
                    on_delivery=delivered,
                )
            p.poll(0)
        left = p.flush(FLUSH_TIMEOUT)
        if left:
            paced.errors.append(f"{left} messages undelivered after {FLUSH_TIMEOUT} s")
    except Exception as exc:
        paced.failed(exc)


def _kp_one(bootstrap: str, topic: str, msgs: list[Msg], paced: _Paced) -> None:
    try:
        producer = kp_producer(bootstrap, enable_idempotence=True, retries=100)
    except Exception as exc:
        paced.failed(exc)
        return
    try:
        futures = []
        for chunk in paced.chunks(msgs, lambda: producer.flush(timeout=FLUSH_TIMEOUT)):
            futures += kp_send(producer, topic, chunk)
        producer.flush(timeout=FLUSH_TIMEOUT)
        for f in futures:
            f.get(timeout=1)
    except Exception as exc:
        paced.failed(exc)
    finally:
        producer.close(timeout=5)


async def _aio_all(bootstrap: str, topic: str, sends: dict[str, list[Msg]], pause: float) -> None:
    from aiokafka import AIOKafkaProducer

    producers = [AIOKafkaProducer(**aio_common(bootstrap), linger_ms=5, acks="all") for _ in sends]
    pending = [list(_chunks(msgs)) for msgs in sends.values()]
    try:
        for producer, chunks in zip(producers, pending, strict=True):
            await producer.start()
            await asyncio.wait_for(
                asyncio.gather(*await _aio_send(producer, topic, chunks.pop(0))), FLUSH_TIMEOUT
            )
        await asyncio.gather(
            *(_aio_one(p, topic, c, pause) for p, c in zip(producers, pending, strict=True))
        )
    finally:
        for producer in producers:
            await producer.stop()


async def _aio_send(producer: Any, topic: str, chunk: list[Msg]) -> list[Any]:
    return [
        await producer.send(topic, m.value, m.key, partition=m.partition, headers=list(m.headers))
        for m in chunk
    ]


async def _aio_one(producer: Any, topic: str, chunks: list[list[Msg]], pause: float) -> None:
    futures = []
    for chunk in chunks:
        futures += await _aio_send(producer, topic, chunk)
        await asyncio.sleep(pause)
    await asyncio.wait_for(asyncio.gather(*futures), FLUSH_TIMEOUT)
