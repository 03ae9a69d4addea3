"""One produce lane: the batching queue in front of one shared broker connection.

A state machine, not a task: see ProduceLane. It applies Apache Kafka's rules for what may share
a request (the package docstring) and must never merge, re-encode or resend a record batch.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
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
from kipside.proxy.stages.coalescing.client_produce import ClientProduce, Submitted
from kipside.proxy.stages.coalescing.placement import LanePlacement
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.telemetry.tracing import finish
from kipside.proxy.upstream.connection import UpstreamConnection
from kipside.proxy.upstream.lanes import LanePool
from kipside.rules import CoalescingRules

log = logging.getLogger("kipside.coalesce")

UNKNOWN_SERVER_ERROR: Final = int(ErrorCode.unknown_server_error)


@dataclass(slots=True)
class QueuedBatch:
    batch: PartitionBatch
    acks: int
    timeout_ms: int
    owner: ClientProduce | None  # None for acks=0: nobody waits for an answer
    client: ClientHandle
    """The client connection this batch came from."""
    span: Span | None = None
    """The client request's span, linked from the upstream request's span."""
    released: bool = False
    """It holds its partition's lane no more (LanePlacement.release was called for it)."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.batch.topic, self.batch.partition)

    def fail(self, error_code: int, message: str) -> None:
        if self.owner is not None:
            self.owner.answer(
                PartitionResult(
                    self.batch.topic, self.batch.partition, error_code, error_message=message
                )
            )


class ProduceLane:
    """The batching queue in front of one lane connection.

    A state machine, not a task: a batch submitted to an idle lane goes upstream at once, in
    the submitting task, and the answer's callback (run by the connection's reader task)
    hands each client its part and sends what queued meanwhile. The lane's own task only does
    what has to wait: dialling the connection, and the linger_ms pause.
    """

    def __init__(
        self, context: FeatureContext, placement: LanePlacement, pool: LanePool, index: int
    ) -> None:
        self.context = context
        self.placement = placement
        self.pool = pool
        self.index = index
        self.queue: deque[QueuedBatch] = deque()
        self._busy = False
        """A request is in flight, or the task is getting one ready: new batches queue."""
        self._task_turn = False
        """The task has the lane (dialling or lingering)."""
        self._wake: trio.Event | None = None

    @property
    def rules(self) -> CoalescingRules:
        """The coalescing rules in force (linger and request size are read per request)."""
        return self.context.rules().coalescing

    def submit(self, item: QueuedBatch) -> None:
        self.queue.append(item)
        if not self._busy:
            self._next()

    def pass_through(
        self, frame: bytes, header: RequestHeader, acks: int, batches: list[QueuedBatch]
    ) -> Submitted | None:
        """Forward a client's request unchanged when it would go upstream alone anyway.

        That is when this lane is idle: nothing in flight or queued, no linger, and the broker
        speaks the client's Produce version. The request then costs no re-encoding and its
        answer none either (the broker's frame goes back under the client's correlation id).
        Returns None when the lane is not idle (the caller queues the batches instead).
        Raises UpstreamFailed if the connection breaks while writing.
        """
        if self._busy or self.queue or self.rules.linger_ms > 0:
            return None
        connection = self.pool.live(self.index)
        versions = self.pool.produce_versions
        if connection is None or versions is None:
            return None
        if not versions[0] <= header.api_version <= versions[1]:
            return None
        self.context.stats.upstream_requests[ApiKey.PRODUCE] += 1
        self.context.stats.coalesced_batches += len(batches)
        try:
            pending = connection.send_nowait(
                frame,
                ApiKey.PRODUCE,
                header.api_version,
                expects_response=acks != 0,
                allowance=max((item.timeout_ms for item in batches), default=0) / 1000,
            )
        except UpstreamFailed:
            self._release(batches)
            raise
        if pending is None:
            self._release(batches)
        else:
            self._busy = True
            pending.on_done(lambda: self._passed(batches, pending))
        return Submitted(pending, raw=True)

    def _passed(self, batches: list[QueuedBatch], pending: Pending) -> None:
        self._busy = False
        if pending.frame is None:
            self._fail_all(batches, pending.failure or "no response")
        else:
            self._release(batches)
        self._next()

    def _release(self, items: list[QueuedBatch]) -> None:
        """These batches are answered or failed: they hold their partitions' lane no more."""
        node_id = self.pool.node_id
        for item in items:
            if item.released:
                continue
            item.released = True
            batch = item.batch
            self.placement.release(item.client, node_id, batch.topic, batch.partition)

    def _take(self) -> list[QueuedBatch]:
        """The batches for the next request, oldest first, by Apache Kafka's merge rules."""
        first_acks = self.queue[0].acks
        cap = self.rules.max_request_bytes
        taken: list[QueuedBatch] = []
        included: set[tuple[str, int]] = set()
        # A partition that had to skip this round stays skipped, so nothing overtakes it.
        held: set[tuple[str, int]] = set()
        remaining: deque[QueuedBatch] = deque()
        size = 0
        for item in self.queue:
            key = item.key
            item_size = len(item.batch.records) if item.batch.records is not None else 0
            if (
                key in included
                or key in held
                or item.acks != first_acks
                or (taken and size + item_size > cap)
            ):
                held.add(key)
                remaining.append(item)
                continue
            included.add(key)
            taken.append(item)
            size += item_size
        self.queue = remaining
        return taken

    def _fail_all(self, taken: list[QueuedBatch], reason: str) -> None:
        failed = taken + list(self.queue)
        self.queue.clear()
        self._release(failed)
        clients = dict.fromkeys(item.client for item in failed)
        for client in clients:
            client.disconnect(f"lane {self.index} to node {self.pool.node_id} failed: {reason}")
        if failed:
            log.warning(
                "lane %d to node %d failed (%s): %d batches unanswered, %d client connections "
                "closed so their clients resend in order",
                self.index,
                self.pool.node_id,
                reason,
                len(failed),
                len(clients),
            )

    def _next(self, connection: UpstreamConnection | None = None) -> None:
        """Send what is queued now, unless that needs waiting: then the task takes over.

        `connection` is one the task has just made ready (used once, even with linger_ms).
        """
        try:
            while self.queue and not self._busy:
                if connection is None:
                    connection = self.pool.live(self.index)
                    if connection is None or self.rules.linger_ms > 0:
                        self._busy = self._task_turn = True
                        if self._wake is not None:
                            self._wake.set()
                        return
                self._send(connection)
                connection = None
        except Exception as exc:
            # A bug must cost the batches in hand, never the lane, the caller or the proxy.
            log.exception("lane %d to node %d: unexpected error", self.index, self.pool.node_id)
            self._busy = False
            self._fail_all([], f"kipside error: {exc!r}")

    async def run(self) -> None:
        """The lane's slow path: dial its connection, linger."""
        while True:
            if not self._task_turn:
                self._wake = trio.Event()
                await self._wake.wait()
            if self.rules.linger_ms > 0:
                await trio.sleep(self.rules.linger_ms / 1000)
            try:
                connection = await self.pool.connection(self.index)
            except UpstreamFailed as exc:
                self._busy = self._task_turn = False
                self._fail_all([], str(exc))
                continue
            self._busy = self._task_turn = False
            self._next(connection)

    def _send(self, connection: UpstreamConnection) -> None:
        taken = self._take()
        try:
            pending, version, span = self._write_request(connection, taken)
        except UpstreamFailed as exc:
            self._fail_all(taken, str(exc))
            return
        except Exception as exc:
            # A bug must cost the batches in hand, never the lane, the caller or the proxy.
            log.exception("lane %d to node %d: unexpected error", self.index, self.pool.node_id)
            self._fail_all(taken, f"kipside error: {exc!r}")
            return
        if pending is None:  # acks=0: nothing comes back; go on with what queued
            self._release(taken)
        else:
            self._busy = True
            pending.on_done(lambda: self._answered(taken, pending, version, span))

    def _write_request(
        self, connection: UpstreamConnection, taken: list[QueuedBatch]
    ) -> tuple[Pending | None, int, Span | None]:
        """One upstream ProduceRequest carrying the taken batches, written now."""
        acks = taken[0].acks
        version = self._upstream_version()
        timeout_ms = max(item.timeout_ms for item in taken)
        body = encode_produce_request(
            version,
            acks=acks,
            timeout_ms=timeout_ms,
            partitions=[item.batch for item in taken],
        )
        header = encode_request_header(ApiKey.PRODUCE, version, 0, "kipside")
        size = len(header) + sum(len(chunk) for chunk in body)
        self.context.stats.upstream_requests[ApiKey.PRODUCE] += 1
        self.context.stats.coalesced_batches += len(taken)
        span = self._span(taken, acks, 4 + size)
        try:
            pending = connection.send_nowait(
                INT32.pack(size) + header,
                ApiKey.PRODUCE,
                version,
                expects_response=acks != 0,
                chunks=body,
                allowance=timeout_ms / 1000,  # the broker may use it up before answering
            )
        except UpstreamFailed:
            finish(span, "UPSTREAM_UNAVAILABLE")
            raise
        if pending is None:
            finish(span)
        return pending, version, span

    def _answered(
        self, taken: list[QueuedBatch], pending: Pending, version: int, span: Span | None
    ) -> None:
        self._busy = False
        try:
            if pending.frame is None:
                finish(span, "UPSTREAM_UNAVAILABLE")
                self._fail_all(taken, pending.failure or "no response")
            else:
                # Released before the answers go out: a client holding its answer (maybe in
                # another thread, for an embedded kipside) finds nothing of it outstanding.
                self._release(taken)
                self._distribute(taken, pending.frame, version)
                finish(span)
        except Exception as exc:
            log.exception("lane %d to node %d: unexpected error", self.index, self.pool.node_id)
            self._fail_all(taken, f"kipside error: {exc!r}")
        self._next()

    def _span(self, taken: list[QueuedBatch], acks: int, request_bytes: int) -> Span | None:
        tracer = self.context.tracer
        if tracer is None or not tracer.active:
            return None
        return tracer.upstream_span(
            ApiKey.PRODUCE,
            self.pool.node_id,
            self.index,
            [item.span for item in taken if item.span is not None],
            {
                "kafka.batch_count": len(taken),
                "kafka.partition_count": len({item.key for item in taken}),
                "kafka.client_request_count": len({id(item.owner) for item in taken}),
                "kafka.request_bytes": request_bytes,
                "kafka.acks": acks,
            },
        )

    def _upstream_version(self) -> int:
        versions = self.pool.produce_versions
        high = PRODUCE_MAX_VERSION if versions is None else min(versions[1], PRODUCE_MAX_VERSION)
        return max(high, PRODUCE_MIN_VERSION)

    def _distribute(self, taken: list[QueuedBatch], frame: bytes, version: int) -> None:
        try:
            header = parse_response_header(frame, ApiKey.PRODUCE, version)
            response = parse_produce_response(frame, header.body_offset, version)
        except DecodeError as exc:
            for item in taken:
                item.fail(
                    UNKNOWN_SERVER_ERROR, f"kipside could not read the broker's answer: {exc}"
                )
            log.error("lane %d: unreadable ProduceResponse: %s", self.index, exc)
            return
        by_partition = {(r.topic, r.partition): r for r in response.partitions}
        for item in taken:
            if item.owner is None:
                continue
            result = by_partition.get(item.key)
            if result is None:
                item.fail(UNKNOWN_SERVER_ERROR, "the broker's answer left this partition out")
                continue
            item.owner.answer(result, response.throttle_time_ms, response.node_endpoints)
