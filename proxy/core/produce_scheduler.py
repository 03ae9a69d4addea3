"""Which ProduceRequest goes upstream on which lane, and when: the produce scheduler, sans-I/O.

The lanes of one broker node (for one principal) carry many clients' record batches. Fed the
batches as clients send them, the answers as the broker gives them and the time, this object
decides which upstream requests to send on which lane, as Apache Kafka's rules allow:

- **At most one batch per partition in a request**, and one acks value per request; batches are
  never merged or re-encoded (the driver copies their bytes into the request as they came).
- **A producer's batches for a partition keep their order.** While one is outstanding (queued
  or in flight), the next ones go on the same lane, behind it: a broker answers a connection's
  requests in order, and a lane that fails fails all of them together, so the client resends
  them in order. Different producers' batches for one partition may go on different lanes and
  travel in parallel.
- **Several requests in flight per lane**, up to `window` (a producer's max.in.flight).
- **Placement that keeps order but not queues.** A batch with nothing outstanding of its
  (client, partition) joins a busy lane's next request when more batches are expected before
  that lane's answer (the busy lane, not holding its partition, that answers soonest by recent
  answer times; arrivals by their recent rate): it then shares a request instead of costing
  one. Otherwise it goes to an idle lane (nothing queued, nothing in flight), or to a new lane,
  opened on demand up to the lane cap; with every lane open and busy, to the busy lane that
  answers soonest, or else to the least loaded one. acks=0 batches are the exception: no
  answer says when one is in the log, so each partition's acks=0 batches keep one lane (a
  stable hash of the partition).
- **When to send.** An idle lane sends at once: waiting would gain nothing. A lane with requests
  in flight lets what arrives meanwhile gather into its next request, which leaves when the
  lane has nothing in flight any more (natural batching: the busier the broker, the bigger the
  requests, the fewer of them), or after `linger` seconds, whichever is first; `linger` is an
  upper bound, never a fixed cost. (Leaving at each answer instead, with others still in
  flight, makes more and smaller requests: in the model of tests/produce_sim.py that costs
  the broker more and the producers more latency.) Batches of one partition that cannot
  share a request leave together in successive requests, pipelined, not one round trip apart.
- **Barriers.** `barrier` queues a marker on a lane behind everything queued there; `ready`
  returns it as a request of its own (acks `BARRIER`) once all before it are sent, and nothing
  queued after it overtakes it. The driver sends a request that every broker answers in its
  place: its answer says the broker has handled every earlier request on that lane, acks=0 ones
  included (what a partition's acks=0 batches wait for before they may take another route).
- **A client request alone on an idle lane passes through**: the driver forwards the client's
  own frame unchanged (`Placed.whole`), which costs no re-encoding at all.

Lanes the scheduler no longer uses are closed after `idle_close` seconds (`idle_lanes`). It
never does I/O: the driver (stages.coalescing.lanes) dials, writes, reads and keeps time.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["BARRIER", "DEFAULT_WINDOW", "Batch", "Placed", "ProduceScheduler", "Request"]

DEFAULT_WINDOW: Final = 5
"""Requests in flight on one lane at most: the Java producer's max.in.flight default."""
DEFAULT_IDLE_CLOSE_SECONDS: Final = 300.0
BARRIER: Final = -2
"""The acks value of a barrier: a request of its own that carries no batch."""
EWMA: Final = 0.1
"""Weight of the newest sample in the scheduler's running averages."""


def stable_lane(topic: str, partition: int, lanes: int) -> int:
    """A partition's lane, the same across processes and restarts (hash() is salted)."""
    return (zlib.crc32(topic.encode("utf-8")) + partition) % lanes


@dataclass(slots=True, eq=False)
class Batch:
    """One client's record batch for one partition, as the scheduler sees it."""

    client: Hashable
    """The client connection it came from (its handle: compared by identity)."""
    topic: str
    partition: int
    size: int
    """Bytes of its records (the request size cap counts them)."""
    acks: int
    timeout_ms: int
    item: object = None
    """The driver's own record of the batch (its bytes, its client's answer, its span)."""
    lane: int = -1
    """The lane it was placed on."""
    queued_at: float = 0.0


@dataclass(slots=True, eq=False)
class Request:
    """One upstream ProduceRequest: its lane, its batches in request order."""

    lane: int
    batches: list[Batch]
    acks: int
    timeout_ms: int
    whole: bool = False
    """The one client request it carries goes as the client sent it (passed through)."""
    sent_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a client request's batches went: `whole` when the driver may pass the client's
    frame through unchanged on `lane` (then it must call `passed_through`)."""

    lane: int
    whole: bool


@dataclass(slots=True)
class _Lane:
    index: int
    queue: deque[Batch] = field(default_factory=deque)
    in_flight: deque[Request] = field(default_factory=deque)
    open: bool = False
    """The driver has (or is dialling) its connection."""
    last_used: float = 0.0

    @property
    def idle(self) -> bool:
        return not self.queue and not self.in_flight

    @property
    def load(self) -> int:
        return len(self.in_flight) + len(self.queue)


class ProduceScheduler:
    """The produce scheduler of one lane pool (see the module docstring)."""

    def __init__(
        self,
        *,
        lanes: int,
        max_request_bytes: int,
        linger: float = 0.0,
        window: int = DEFAULT_WINDOW,
        idle_close: float = DEFAULT_IDLE_CLOSE_SECONDS,
    ) -> None:
        self.lane_cap = lanes
        self.max_request_bytes = max_request_bytes
        self.linger = linger
        """Seconds a batch may wait for a busy lane's next request at most (rules.linger_ms)."""
        self.window = window
        self.idle_close = idle_close
        self._lanes: list[_Lane] = []
        self._outstanding: dict[tuple[Hashable, str, int], list[int]] = {}
        """(client, topic, partition) -> [lane, batches outstanding]."""
        self.sent_requests = 0
        self._rtt = 0.0
        """Recent answer times (an average that follows them)."""
        self._arrivals_per_second = 0.0
        """Recent batch arrivals a second (an average that follows them)."""
        self._last_arrival = -math.inf

    # Placing ----------------------------------------------------------------------------

    def submit(self, batches: Sequence[Batch], now: float) -> Placed:
        """Place one client request's batches (all of one acks value). `Placed.whole` says the
        request may pass through as it is; else its batches are queued and `ready` says when
        they leave."""
        self._arrived(now)
        if len(batches) == 1:  # the usual case, on the hot path
            batch = batches[0]
            lane = self._place(batch, now)
            if lane.idle:
                return Placed(lane.index, True)
            self._queue(batch, lane, now)
            return Placed(lane.index, False)
        chosen = [self._place(batch, now) for batch in batches]
        first = chosen[0]
        if all(lane is first for lane in chosen) and first.idle:
            return Placed(first.index, True)
        for batch, lane in zip(batches, chosen, strict=True):
            self._queue(batch, lane, now)
        return Placed(first.index, False)

    def enqueue(self, placed: Placed, batches: Sequence[Batch], now: float) -> None:
        """The driver could not pass through a request offered `whole` (its lane's connection
        is not open yet, or the broker doesn't speak the client's version): queue it there."""
        lane = self._lanes[placed.lane]
        for batch in batches:
            self._queue(batch, lane, now)

    def passed_through(self, placed: Placed, batches: list[Batch], now: float) -> Request:
        """The driver forwarded the client's frame on `placed.lane`: it is in flight there."""
        lane = self._lanes[placed.lane]
        for batch in batches:
            self._count(batch, lane)
        request = Request(lane.index, batches, batches[0].acks, batches[0].timeout_ms, True, now)
        lane.in_flight.append(request)
        lane.last_used = now
        self.sent_requests += 1
        return request

    def _place(self, batch: Batch, now: float) -> _Lane:
        key = (batch.client, batch.topic, batch.partition)
        held = self._outstanding.get(key)
        if held is not None:
            return self._lanes[held[0]]
        if batch.acks == 0:
            # Nothing tells when an acks=0 batch is written to the log: the next one of its
            # partition must follow it on the same connection, so each partition keeps a lane.
            return self._lane(stable_lane(batch.topic, batch.partition, self.lane_cap))
        idle: _Lane | None = None
        join: _Lane | None = None
        join_wait = math.inf
        fallback: _Lane | None = None
        fallback_load = math.inf
        for lane in self._lanes:
            if lane.idle:
                if idle is None:
                    idle = lane
                continue
            if lane.load < fallback_load:
                fallback, fallback_load = lane, lane.load
            if len(lane.in_flight) >= self.window or _holds(lane, batch):
                continue
            wait = self._wait(lane, now)
            if wait < join_wait:
                join, join_wait = lane, wait
        if join is not None and self._worth_joining(join, join_wait):
            return join
        if idle is not None:
            return idle
        if len(self._lanes) < self.lane_cap:
            return self._lane(len(self._lanes))
        if join is not None:
            return join
        assert fallback is not None
        return fallback

    def _wait(self, lane: _Lane, now: float) -> float:
        """How long a batch joining this busy lane's next request may wait: until the answer
        to its oldest request in flight, as recent answers went."""
        if not lane.in_flight:
            return 0.0
        return max(self._rtt - (now - lane.in_flight[0].sent_at), 0.0)

    def _worth_joining(self, lane: _Lane, wait: float) -> bool:
        """Whether waiting `wait` for a busy lane gains something over an idle lane now: the
        request it joins carries others already, or more are due before it leaves."""
        return bool(lane.queue) or wait * self._arrivals_per_second >= 1.0

    def _arrived(self, now: float) -> None:
        gap = now - self._last_arrival
        self._last_arrival = now
        if gap > 0:
            rate = 1.0 / gap
            self._arrivals_per_second += (rate - self._arrivals_per_second) * EWMA
        else:
            self._arrivals_per_second *= 1 + EWMA

    def _lane(self, index: int) -> _Lane:
        while len(self._lanes) <= index:
            self._lanes.append(_Lane(len(self._lanes)))
        return self._lanes[index]

    def _count(self, batch: Batch, lane: _Lane) -> None:
        batch.lane = lane.index
        key = (batch.client, batch.topic, batch.partition)
        held = self._outstanding.get(key)
        if held is None:
            self._outstanding[key] = [lane.index, 1]
        else:
            held[1] += 1

    def _queue(self, batch: Batch, lane: _Lane, now: float) -> None:
        self._count(batch, lane)
        batch.queued_at = now
        lane.queue.append(batch)

    # Sending ----------------------------------------------------------------------------

    def ready(self, now: float) -> list[Request]:
        """Every request to send now, in order per lane (the driver writes them in this
        order); each is in flight from now on."""
        out: list[Request] = []
        for lane in self._lanes:
            if lane.queue and self._due(lane, now):
                self._drain(lane, now, out)
        return out

    def _due(self, lane: _Lane, now: float) -> bool:
        if not lane.in_flight:
            return True
        if len(lane.in_flight) >= self.window:
            return False
        # The same sum as next_deadline's, so a timer set for it finds the batch due.
        return self.linger > 0 and now >= lane.queue[0].queued_at + self.linger

    def _drain(self, lane: _Lane, now: float, out: list[Request]) -> None:
        """Requests from the lane's queue, oldest batches first, while the window allows."""
        cap = self.max_request_bytes
        while lane.queue and len(lane.in_flight) < self.window:
            queue = lane.queue
            acks = queue[0].acks
            rest: deque[Batch] = deque()
            if acks == BARRIER:
                taken = [queue.popleft()]
                rest = queue
            else:
                taken = []
                seen: set[tuple[str, int]] = set()
                held: set[tuple[str, int]] = set()
                size = 0
                while queue:
                    batch = queue.popleft()
                    key = (batch.topic, batch.partition)
                    if (
                        key in seen
                        or key in held
                        or batch.acks != acks
                        or (taken and size + batch.size > cap)
                    ):
                        if batch.acks == BARRIER:  # nothing after it leaves before it
                            queue.appendleft(batch)
                            break
                        held.add(key)  # what had to wait keeps its place: nothing overtakes it
                        rest.append(batch)
                        continue
                    seen.add(key)
                    taken.append(batch)
                    size += batch.size
                rest.extend(queue)
            lane.queue = rest
            timeout_ms = max(batch.timeout_ms for batch in taken)
            request = Request(lane.index, taken, acks, timeout_ms, sent_at=now)
            lane.in_flight.append(request)
            lane.last_used = now
            self.sent_requests += 1
            out.append(request)

    def next_deadline(self) -> float:
        """When `ready` may have something to send without any other event (a linger ending),
        or math.inf."""
        if self.linger <= 0:
            return math.inf
        due = math.inf
        for lane in self._lanes:
            if lane.queue and lane.in_flight and len(lane.in_flight) < self.window:
                due = min(due, lane.queue[0].queued_at + self.linger)
        return due

    def barrier(self, index: int, token: object, now: float) -> None:
        """Queue a barrier (carrying `token`) behind everything queued on lane `index`."""
        self._lane(index).queue.append(Batch(None, "", -1, 0, BARRIER, 0, token, index, now))

    # Answers ----------------------------------------------------------------------------

    def sent_without_answer(self, request: Request) -> None:
        """An acks=0 request is written: nothing will come back, it holds nothing more. (A
        barrier's answer is given here too: it says nothing about produce times.)"""
        self._finished(request)

    def answered(self, request: Request, now: float) -> None:
        """The broker answered `request` (the driver gives each batch its part first)."""
        self._rtt += (now - request.sent_at - self._rtt) * EWMA
        self._finished(request)

    def _finished(self, request: Request) -> None:
        lane = self._lanes[request.lane]
        try:
            lane.in_flight.remove(request)
        except ValueError:
            return  # the lane failed meanwhile
        for batch in request.batches:
            self._release(batch)

    def _release(self, batch: Batch) -> None:
        key = (batch.client, batch.topic, batch.partition)
        held = self._outstanding.get(key)
        if held is not None:
            held[1] -= 1
            if held[1] <= 0:
                del self._outstanding[key]

    def lane_failed(self, index: int) -> list[Batch]:
        """The lane's connection failed: every batch in flight or queued on it is lost (its
        client must resend, in order). Returns them."""
        lane = self._lanes[index]
        lost = [b for request in lane.in_flight for b in request.batches] + list(lane.queue)
        lane.in_flight.clear()
        lane.queue.clear()
        lane.open = False
        for batch in lost:
            self._release(batch)
        return lost

    # Lanes ------------------------------------------------------------------------------

    def lanes_in_use(self) -> int:
        return len(self._lanes)

    def outstanding(self) -> int:
        """Batches queued or in flight."""
        return sum(held[1] for held in self._outstanding.values())

    def in_flight(self, index: int) -> int:
        return len(self._lanes[index].in_flight) if index < len(self._lanes) else 0

    def idle_lanes(self, now: float) -> list[int]:
        """Open lanes unused for `idle_close` seconds: the driver closes their connections."""
        closing = []
        for lane in self._lanes:
            if lane.open and lane.idle and now - lane.last_used >= self.idle_close:
                lane.open = False
                closing.append(lane.index)
        return closing

    def opened(self, index: int, now: float) -> None:
        lane = self._lanes[index]
        lane.open = True
        lane.last_used = now


def _holds(lane: _Lane, batch: Batch) -> bool:
    """Whether the lane's next request already holds a batch of this batch's partition."""
    return any(b.partition == batch.partition and b.topic == batch.topic for b in lane.queue)
