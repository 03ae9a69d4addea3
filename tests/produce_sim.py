"""A model of producers, kipside's produce scheduler and a broker, on a model clock, to try the
scheduler's policy without sockets (tests/test_produce_scheduler.py).

The model broker serves each connection one request at a time, as Kafka does (a connection is
muted from a request's read until its answer is sent, so requests pipelined on one connection
wait their turn), with `workers` requests in service at once across connections; a request
costs `per_request` plus `per_batch` for each batch it carries, then waits `replication` (for
acks=all) with its connection still muted. Producers send one batch per message, open loop at
`rate` messages a second or closed loop (the next message once the last is acknowledged); each
message goes to a random partition. Direct, each producer has its own connection; through
kipside, every batch goes through core.produce_scheduler.ProduceScheduler and its lanes. The
broker's log records each producer's batches per partition in the order it appended them.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from kipside.proxy.core.produce_scheduler import Batch, ProduceScheduler, Request

MS = 1e-3


class Clock:
    """Events in model time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._order), fn, args))

    def run(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            self.now, _, fn, args = heapq.heappop(self._events)
            fn(*args)


@dataclass
class Broker:
    clock: Clock
    workers: int = 2
    per_request: float = 0.3 * MS
    per_batch: float = 0.02 * MS
    replication: float = 0.6 * MS
    requests: int = 0
    busy: float = 0.0
    log: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    """(producer, partition) -> the sequence numbers appended, in log order."""
    _free: int = -1
    _ready: deque[Connection] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._free = self.workers

    def serviceable(self, connection: Connection) -> None:
        self._ready.append(connection)
        self._pump()

    def _pump(self) -> None:
        while self._free and self._ready:
            connection = self._ready.popleft()
            request = connection.queue.popleft()
            connection.serving = True
            self._free -= 1
            self.requests += 1
            cost = self.per_request + self.per_batch * len(request)
            self.busy += cost
            self.clock.after(cost, self._appended, connection, request)

    def _appended(self, connection: Connection, request: list[Message]) -> None:
        for message in request:
            self.log.setdefault((message.producer, message.partition), []).append(message.seq)
        self._free += 1
        self._pump()
        self.clock.after(self.replication, self._answer, connection, request)

    def _answer(self, connection: Connection, request: list[Message]) -> None:
        connection.serving = False
        self.clock.after(connection.network, connection.on_answer, request)
        if connection.queue:
            self.serviceable(connection)


@dataclass(eq=False)
class Connection:
    broker: Broker
    on_answer: Callable[[list[Message]], None]
    network: float = 0.05 * MS
    queue: deque[list[Message]] = field(default_factory=deque)
    serving: bool = False

    def send(self, request: list[Message]) -> None:
        self.broker.clock.after(self.network, self._arrive, request)

    def _arrive(self, request: list[Message]) -> None:
        self.queue.append(request)
        if not self.serving and len(self.queue) == 1:
            self.broker.serviceable(self)


@dataclass(eq=False)
class Message:
    producer: int
    partition: int
    seq: int
    sent_at: float


@dataclass(eq=False)
class Producer:
    index: int
    clock: Clock
    rng: random.Random
    partitions: int
    rate: float  # messages a second; 0: closed loop
    route: Callable[[Message], None] = lambda message: None
    latencies: list[float] = field(default_factory=list)
    seq: int = 0

    def start(self) -> None:
        self.clock.after(self.rng.random() / self.rate if self.rate else 0.0, self.send)

    def send(self) -> None:
        self.seq += 1
        self.route(
            Message(self.index, self.rng.randrange(self.partitions), self.seq, self.clock.now)
        )
        if self.rate:
            self.clock.after(self.rng.expovariate(self.rate), self.send)

    def acknowledged(self, message: Message) -> None:
        self.latencies.append(self.clock.now - message.sent_at)
        if not self.rate:
            self.send()


@dataclass
class Outcome:
    messages: int
    p50_ms: float
    p99_ms: float
    broker_requests: int
    broker_busy: float
    log: dict[tuple[int, int], list[int]]

    @property
    def in_order(self) -> bool:
        return all(seqs == sorted(seqs) for seqs in self.log.values())


def run(
    path: str,
    *,
    producers: int,
    partitions: int,
    rate: float,
    seconds: float,
    lanes: int = 2,
    linger: float = 0.0,
    hop: float = 0.1 * MS,
    seed: int = 1,
    broker: dict[str, float] | None = None,
) -> Outcome:
    """`path`: "direct", or "kipside" (through the scheduler, `hop` each way)."""
    clock, rng = Clock(), random.Random(seed)
    model = Broker(clock, **(broker or {}))  # type: ignore[arg-type]
    fleet = [Producer(i, clock, rng, partitions, rate) for i in range(producers)]
    if path == "direct":
        for producer in fleet:
            direct(producer, model)
    else:
        lanes_ = ModelLanes(clock, model, lanes, linger)
        for producer in fleet:
            through(producer, lanes_, hop)
    for producer in fleet:
        producer.start()
    clock.run(seconds)
    latencies = sorted(x for p in fleet for x in p.latencies)

    def quantile(q: float) -> float:
        return latencies[int(q * (len(latencies) - 1))] / MS if latencies else math.nan

    return Outcome(
        len(latencies), quantile(0.5), quantile(0.99), model.requests, model.busy, model.log
    )


def direct(producer: Producer, broker: Broker) -> None:
    """The producer on a connection of its own."""

    def answered(messages: list[Message]) -> None:
        for message in messages:
            producer.acknowledged(message)

    own = Connection(broker, answered)

    def send(message: Message) -> None:
        own.send([message])

    producer.route = send


def through(producer: Producer, lanes: ModelLanes, hop: float) -> None:
    """The producer through kipside: `hop` to reach it, `hop` for the answer to come back."""

    def send(message: Message) -> None:
        lanes.clock.after(hop, lanes.submit, producer, message, hop)

    producer.route = send


class ModelLanes:
    """The scheduler's driver in the model: lanes as model connections, answers split back."""

    def __init__(self, clock: Clock, broker: Broker, lanes: int, linger: float) -> None:
        self.clock = clock
        self.scheduler = ProduceScheduler(lanes=lanes, max_request_bytes=1 << 20, linger=linger)
        self.connections = [Connection(broker, self._answer_of(i)) for i in range(lanes)]
        self._requests: dict[int, deque[Request]] = {i: deque() for i in range(lanes)}
        self._timer_at = math.inf

    def submit(self, producer: Producer, message: Message, hop: float) -> None:
        batch = Batch(producer, "t", message.partition, 100, -1, 30000, (producer, message, hop))
        placed = self.scheduler.submit([batch], self.clock.now)
        if placed.whole:
            request = self.scheduler.passed_through(placed, [batch], self.clock.now)
            self._send(request)
        self._flush()

    def _send(self, request: Request) -> None:
        self._requests[request.lane].append(request)
        messages = [cast(tuple[Producer, Message, float], b.item)[1] for b in request.batches]
        self.connections[request.lane].send(messages)

    def _flush(self) -> None:
        for request in self.scheduler.ready(self.clock.now):
            self._send(request)
        due = self.scheduler.next_deadline()
        if due < self._timer_at:
            self._timer_at = due
            self.clock.after(max(due - self.clock.now, 0.0), self._timer)

    def _timer(self) -> None:
        self._timer_at = math.inf
        self._flush()

    def _answer_of(self, lane: int) -> Callable[[list[Message]], None]:
        def answered(_messages: list[Message]) -> None:
            request = self._requests[lane].popleft()  # a connection answers in order
            self.scheduler.answered(request, self.clock.now)
            for batch in request.batches:
                producer, message, hop = cast(tuple[Producer, Message, float], batch.item)
                self.clock.after(hop, producer.acknowledged, message)
            self._flush()

        return answered
