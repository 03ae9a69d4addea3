"""The trio driver of one lane pool's produce scheduler: it writes what the scheduler decides.

core.produce_scheduler.ProduceScheduler decides which request goes on which lane and when; this
driver builds each request from its batches' bytes (never re-encoded: protocol.produce copies
them as they came), writes it on its lane's connection (dialling the lane first, the requests
that wait for it written in their order once it is up), splits the broker's answer into each
client's part (client_produce), and keeps time (a linger's end, closing idle lanes). A lane that
fails closes the client connections that had a batch on it, as a broker disconnect would: they
resend in order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

import trio
from opentelemetry.trace import Span

from kipside.protocol import (
    INT32,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    ApiKey,
    DecodeError,
    ErrorCode,
    PartitionBatch,
    PartitionResult,
    RequestHeader,
    encode_produce_request,
    encode_request_header,
    parse_produce_response,
    parse_response_header,
)
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.decisions import ClientHandle
from kipside.proxy.core.produce_scheduler import (
    BARRIER,
    Batch,
    Placed,
    ProduceScheduler,
    Request,
)
from kipside.proxy.stages.coalescing.client_produce import ClientProduce, Submitted
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.telemetry.tracing import finish
from kipside.proxy.upstream.connection import UpstreamConnection
from kipside.proxy.upstream.lanes import LanePool
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import CoalescingRules

log = logging.getLogger("kipside.coalesce")

UNKNOWN_SERVER_ERROR: Final = int(ErrorCode.unknown_server_error)


@dataclass(slots=True)
class QueuedBatch:
    """What the driver keeps of a batch the scheduler places."""

    batch: PartitionBatch
    owner: ClientProduce | None  # None for acks=0: nobody waits for an answer
    client: ClientHandle
    span: Span | None = None
    """The client request's span, linked from the upstream request's span."""

    def fail(self, error_code: int, message: str) -> None:
        if self.owner is not None:
            self.owner.answer(
                PartitionResult(
                    self.batch.topic, self.batch.partition, error_code, error_message=message
                )
            )


class ProduceLanes:
    """One lane pool's produce traffic: its scheduler, and the lanes' connections."""

    def __init__(self, context: FeatureContext, pool: LanePool, nodes: NodeMap) -> None:
        self.context = context
        self.pool = pool
        self.nodes = nodes
        """Where the answers' node endpoints are learned and rewritten."""
        rules = self.rules
        self.scheduler = ProduceScheduler(
            lanes=pool.lanes,
            max_request_bytes=rules.max_request_bytes,
            linger=rules.linger_ms / 1000,
        )
        self._waiting: dict[int, deque[Request]] = {}
        """Per lane being dialled, the requests to write once it is up, in order."""
        self._wake: trio.Event | None = None
        self._barriers: dict[int, Callable[[], Pending]] = {}
        """Per lane, its `barrier` (one callable per lane, so callers can tell lanes apart)."""

    @property
    def rules(self) -> CoalescingRules:
        """The coalescing rules in force (linger and request size are read per request)."""
        return self.context.rules().coalescing

    # Submitting -------------------------------------------------------------------------

    def submit(
        self,
        batches: list[Batch],
        frame: bytes,
        header: RequestHeader,
        acks: int,
        now: float,
        rules: CoalescingRules,
    ) -> Submitted:
        """Place a client request's batches (read at `now`, under `rules`); passed through
        unchanged to an idle lane, or queued. Raises UpstreamFailed if a passed-through
        request's connection breaks."""
        scheduler = self.scheduler
        scheduler.linger = rules.linger_ms / 1000
        scheduler.max_request_bytes = rules.max_request_bytes
        placed = scheduler.submit(batches, now)
        if placed.whole:
            passed = self._pass_through(placed, batches, frame, header, acks, now)
            if passed is not None:
                return passed
            scheduler.enqueue(placed, batches, now)
        owner = None
        if acks != 0:
            keys = [(b.topic, b.partition) for b in batches]
            owner = ClientProduce(header.correlation_id, header.api_version, keys, self.nodes)
        for batch in batches:
            batch.item.owner = owner  # type: ignore[attr-defined]
        self._send_ready(now)
        if owner is None:
            return Submitted(None, False, self._barriers_of(batches))
        return Submitted(owner.pending, raw=False)

    def _pass_through(
        self,
        placed: Placed,
        batches: list[Batch],
        frame: bytes,
        header: RequestHeader,
        acks: int,
        now: float,
    ) -> Submitted | None:
        """Forward the client's request unchanged when it goes upstream alone anyway (an idle
        lane with its connection up, the broker speaks the client's version, no span to link):
        no re-encoding, and the broker's answer goes back as it came. None when it can't."""
        if self.context.tracer is not None:
            return None
        connection = self.pool.live(placed.lane)
        versions = self.pool.produce_versions
        if connection is None or versions is None or placed.lane in self._waiting:
            return None
        if not versions[0] <= header.api_version <= versions[1]:
            return None
        stats = self.context.stats
        stats.upstream_requests[ApiKey.PRODUCE] += 1
        stats.coalesced_batches += len(batches)
        request = self.scheduler.passed_through(placed, batches, now)
        try:
            pending = connection.send_nowait(
                frame,
                ApiKey.PRODUCE,
                header.api_version,
                expects_response=acks != 0,
                allowance=request.timeout_ms / 1000,
                now=now,
            )
        except UpstreamFailed:
            self._lane_failed(placed.lane, "the connection broke")
            raise
        if pending is None:
            self.scheduler.sent_without_answer(request)
            self._send_ready(now)
            return Submitted(None, True, self._barriers_of(batches))
        pending.on_done(lambda: self._whole_answered(request, pending))
        return Submitted(pending, raw=True)

    def _whole_answered(self, request: Request, pending: Pending) -> None:
        if pending.frame is None:
            self._lane_failed(request.lane, pending.failure or "no response")
            return
        now = trio.current_time()
        self.scheduler.answered(request, now)
        self._send_ready(now)

    # Barriers ---------------------------------------------------------------------------

    def barrier(self, lane: int) -> Pending:
        """An answer that comes once the broker has handled every batch placed on `lane` so
        far, acks=0 ones included: a request of kipside's own, queued behind them."""
        token = Pending()
        if self.pool.live(lane) is None and lane not in self._waiting:
            # Closed, and so idle: what it carried is as done as it will ever be.
            token.resolve(b"")
            return token
        now = trio.current_time()
        self.scheduler.barrier(lane, token, now)
        self._send_ready(now)
        return token

    def _barriers_of(self, batches: list[Batch]) -> dict[tuple[str, int], Callable[[], Pending]]:
        """Per partition of an acks=0 request, the barrier of the lane its batch took."""
        barriers = self._barriers
        out = {}
        for batch in batches:
            barrier = barriers.get(batch.lane)
            if barrier is None:
                barrier = barriers[batch.lane] = partial(self.barrier, batch.lane)
            out[(batch.topic, batch.partition)] = barrier
        return out

    def _write_barrier(self, connection: UpstreamConnection, request: Request) -> None:
        token: Pending = request.batches[0].item  # type: ignore[assignment]
        try:
            pending = connection.barrier_nowait()
        except UpstreamFailed as exc:
            self._lane_failed(request.lane, str(exc))
            return

        def passed() -> None:
            if pending.frame is None:
                self._lane_failed(request.lane, pending.failure or "no response")
                return
            self.scheduler.sent_without_answer(request)
            token.resolve(pending.frame)
            self._send_ready(trio.current_time())

        pending.on_done(passed)

    # Sending ----------------------------------------------------------------------------

    def _send_ready(self, now: float) -> None:
        """Write every request the scheduler says is due; a lane still to be dialled gets its
        requests once it is up. An acks=0 request is done once written, which frees its lane's
        window for what waits behind it: the scheduler is asked again until nothing is due."""
        try:
            while requests := self.scheduler.ready(now):
                for request in requests:
                    waiting = self._waiting.get(request.lane)
                    connection = self.pool.live(request.lane) if waiting is None else None
                    if connection is None:
                        if waiting is None:
                            waiting = self._waiting[request.lane] = deque()
                            self.context.nursery.start_soon(self._dial, request.lane)
                        waiting.append(request)
                        continue
                    self._write(connection, request)
        except Exception as exc:
            # A bug must cost the batches in hand, never the lanes, the caller or the proxy.
            log.exception("produce lanes to node %d: unexpected error", self.pool.node_id)
            for index in range(self.scheduler.lanes_in_use()):
                self._lane_failed(index, f"kipside error: {exc!r}")
        if self.scheduler.next_deadline() < float("inf") and self._wake is not None:
            self._wake.set()

    async def _dial(self, index: int) -> None:
        try:
            connection = await self.pool.connection(index)
        except UpstreamFailed as exc:
            self._waiting.pop(index, None)
            self._lane_failed(index, str(exc))
            return
        self.scheduler.opened(index, trio.current_time())
        waiting = self._waiting.pop(index, deque())
        for request in waiting:
            if connection.closed:
                break
            self._write(connection, request)
        self._send_ready(trio.current_time())  # what the written acks=0 requests held back

    def _write(self, connection: UpstreamConnection, request: Request) -> None:
        """One upstream ProduceRequest carrying the request's batches, written now."""
        if request.acks == BARRIER:
            self._write_barrier(connection, request)
            return
        items: list[QueuedBatch] = [b.item for b in request.batches]  # type: ignore[misc]
        version = self._upstream_version()
        body = encode_produce_request(
            version,
            acks=request.acks,
            timeout_ms=request.timeout_ms,
            partitions=[item.batch for item in items],
        )
        head = encode_request_header(ApiKey.PRODUCE, version, 0, "kipside")
        size = len(head) + sum(len(chunk) for chunk in body)
        stats = self.context.stats
        stats.upstream_requests[ApiKey.PRODUCE] += 1
        stats.coalesced_batches += len(items)
        span = self._span(request, items, 4 + size)
        try:
            pending = connection.send_nowait(
                INT32.pack(size) + head,
                ApiKey.PRODUCE,
                version,
                expects_response=request.acks != 0,
                chunks=body,
                allowance=request.timeout_ms / 1000,  # the broker may use it up first
            )
        except UpstreamFailed as exc:
            finish(span, "UPSTREAM_UNAVAILABLE")
            self._lane_failed(request.lane, str(exc))
            return
        if pending is None:  # acks=0: nothing comes back
            finish(span)
            self.scheduler.sent_without_answer(request)
            return
        pending.on_done(lambda: self._answered(request, items, pending, version, span))

    def _answered(
        self,
        request: Request,
        items: list[QueuedBatch],
        pending: Pending,
        version: int,
        span: Span | None,
    ) -> None:
        if pending.frame is None:
            finish(span, "UPSTREAM_UNAVAILABLE")
            self._lane_failed(request.lane, pending.failure or "no response")
            return
        now = trio.current_time()
        # Released before the answers go out: a client holding its answer finds nothing of
        # it outstanding.
        self.scheduler.answered(request, now)
        try:
            self._distribute(items, pending.frame, version)
        except Exception as exc:
            log.exception("produce lanes to node %d: unexpected error", self.pool.node_id)
            for item in items:
                item.fail(UNKNOWN_SERVER_ERROR, f"kipside error: {exc!r}")
        finish(span)
        self._send_ready(now)

    def _distribute(self, items: list[QueuedBatch], frame: bytes, version: int) -> None:
        try:
            header = parse_response_header(frame, ApiKey.PRODUCE, version)
            response = parse_produce_response(frame, header.body_offset, version)
        except DecodeError as exc:
            for item in items:
                item.fail(
                    UNKNOWN_SERVER_ERROR, f"kipside could not read the broker's answer: {exc}"
                )
            log.error("node %d: unreadable ProduceResponse: %s", self.pool.node_id, exc)
            return
        by_partition = {(r.topic, r.partition): r for r in response.partitions}
        for item in items:
            if item.owner is None:
                continue
            result = by_partition.get((item.batch.topic, item.batch.partition))
            if result is None:
                item.fail(UNKNOWN_SERVER_ERROR, "the broker's answer left this partition out")
                continue
            item.owner.answer(result, response.throttle_time_ms, response.node_endpoints)

    # Failures and time ------------------------------------------------------------------

    def _lane_failed(self, index: int, reason: str) -> None:
        lost = self.scheduler.lane_failed(index)
        waiting = self._waiting.get(index)
        if waiting is not None:
            waiting.clear()
        for batch in lost:
            if batch.acks == BARRIER:
                batch.item.fail(reason)  # type: ignore[attr-defined]
        lost = [batch for batch in lost if batch.acks != BARRIER]
        clients = dict.fromkeys(batch.client for batch in lost)
        for client in clients:
            client.disconnect(  # type: ignore[attr-defined]
                f"lane {index} to node {self.pool.node_id} failed: {reason}"
            )
        if lost:
            log.warning(
                "lane %d to node %d failed (%s): %d batches unanswered, %d client connections "
                "closed so their clients resend in order",
                index,
                self.pool.node_id,
                reason,
                len(lost),
                len(clients),
            )

    async def run(self) -> None:
        """The lanes' clock: a linger's end, and closing lanes left idle."""
        scheduler = self.scheduler
        while True:
            self._wake = trio.Event()
            deadline = min(
                scheduler.next_deadline(), trio.current_time() + scheduler.idle_close / 4
            )
            with trio.move_on_at(deadline):
                await self._wake.wait()
            now = trio.current_time()
            self._send_ready(now)
            for index in scheduler.idle_lanes(now):
                connection = self.pool.live(index)
                if connection is not None:
                    log.info("%s: idle for %g s, closed", connection.name, scheduler.idle_close)
                    await self.pool.close_lane(index)

    # Helpers ----------------------------------------------------------------------------

    def _span(self, request: Request, items: list[QueuedBatch], request_bytes: int) -> Span | None:
        tracer = self.context.tracer
        if tracer is None or not tracer.active:
            return None
        return tracer.upstream_span(
            ApiKey.PRODUCE,
            self.pool.node_id,
            request.lane,
            [item.span for item in items if item.span is not None],
            {
                "kafka.batch_count": len(items),
                "kafka.partition_count": len({(i.batch.topic, i.batch.partition) for i in items}),
                "kafka.client_request_count": len({id(item.owner) for item in items}),
                "kafka.request_bytes": request_bytes,
                "kafka.acks": request.acks,
            },
        )

    def _upstream_version(self) -> int:
        versions = self.pool.produce_versions
        high = PRODUCE_MAX_VERSION if versions is None else min(versions[1], PRODUCE_MAX_VERSION)
        return max(high, PRODUCE_MIN_VERSION)
