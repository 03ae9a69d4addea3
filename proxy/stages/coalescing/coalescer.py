"""The coalescer: takes eligible ProduceRequests off client sessions and feeds the lanes.

It decides which requests coalesce (the coalescing rules; never transactional or malformed
ones), places each batch on a lane and makes the lanes on first use. It never writes to a
connection itself: the lanes do.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from opentelemetry.trace import Span

from kipside.protocol import (
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    PartitionBatch,
    RequestHeader,
    parse_produce_request,
)
from kipside.proxy.core.decisions import ClientHandle
from kipside.proxy.core.identity import Principal
from kipside.proxy.stages.coalescing.client_produce import ClientProduce, Submitted
from kipside.proxy.stages.coalescing.lane import ProduceLane, QueuedBatch
from kipside.proxy.stages.coalescing.placement import LanePlacement
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import CoalescingRules


class ProducePlan(NamedTuple):
    """How a ProduceRequest is to go upstream, decided by Coalescer.plan."""

    partitions: tuple[tuple[str, int], ...] | None
    """Its (topic, partition)s in request order; None: not read (coalescing is off, or the
    version is not one kipside coalesces)."""
    coalesce: bool = False
    """To the lanes (Coalescer.take); else on the client's own connection, untouched."""
    batches: tuple[PartitionBatch, ...] = ()
    acks: int = -1
    timeout_ms: int = 0


UNREAD: Final = ProducePlan(None)


class Coalescer:
    """Takes eligible ProduceRequests off client sessions and feeds the lanes."""

    def __init__(self, context: FeatureContext, nodes: NodeMap) -> None:
        self.context = context
        self.nodes = nodes
        """Where the answers' node endpoints are learned and rewritten."""
        self.placement = LanePlacement()
        self._lanes: dict[tuple[int, Principal, int], ProduceLane] = {}

    @property
    def rules(self) -> CoalescingRules:
        """The coalescing rules in force; a reload changes them for requests from then on
        (the lane count of existing pools doesn't change)."""
        return self.context.rules().coalescing

    def _lane(self, node_id: int, principal: Principal, index: int) -> ProduceLane:
        key = (node_id, principal, index)
        lane = self._lanes.get(key)
        if lane is None:
            pool = self.context.pools(node_id, principal)
            lane = ProduceLane(self.context, self.placement, pool, index)
            self._lanes[key] = lane
            self.context.nursery.start_soon(lane.run)
        return lane

    def eligible(self, header: RequestHeader) -> bool:
        return (
            self.rules.enabled and PRODUCE_MIN_VERSION <= header.api_version <= PRODUCE_MAX_VERSION
        )

    def plan(self, frame: bytes, header: RequestHeader, client_id: str | None) -> ProducePlan:
        """Whether this ProduceRequest coalesces under the rules in force, and its partitions.

        Synchronous, and `take` after it must be too: a reload between them would split the
        request's decision from the rules that made it."""
        if not self.eligible(header):
            return UNREAD
        request = parse_produce_request(
            frame, header.body_offset, header.api_version, self.context.rules().limits.decode_limits
        )
        keys = tuple((p.topic, p.partition) for p in request.partitions)
        plan = ProducePlan(keys)
        if request.transactional_id is not None or not request.partitions:
            return plan
        if len(set(keys)) != len(keys) or any(p.records is None for p in request.partitions):
            return plan  # let the broker answer malformed requests itself
        rules = self.rules
        if not all(rules.applies(p.topic, client_id or "") for p in request.partitions):
            return plan
        return ProducePlan(keys, True, request.partitions, request.acks, request.timeout_ms)

    def take(
        self,
        plan: ProducePlan,
        node_id: int,
        principal: Principal,
        frame: bytes,
        header: RequestHeader,
        client: ClientHandle,
        span: Span | None = None,
    ) -> Submitted:
        """Take a planned request's batches: passed through unchanged to an idle lane, or
        queued. Raises UpstreamFailed if a passed-through request's connection breaks."""
        assert plan.partitions is not None and plan.coalesce
        acks, timeout_ms = plan.acks, plan.timeout_ms
        lanes = self.context.pools(node_id, principal).lanes
        place = self.placement.place
        indexes = [place(client, node_id, p.topic, p.partition, acks, lanes) for p in plan.batches]
        batches = [QueuedBatch(p, acks, timeout_ms, None, client) for p in plan.batches]
        if self.context.tracer is None and indexes.count(indexes[0]) == len(indexes):
            lane = self._lane(node_id, principal, indexes[0])
            passed = lane.pass_through(frame, header, acks, batches)
            if passed is not None:
                return passed
        owner = None
        if acks != 0:
            keys = list(plan.partitions)
            owner = ClientProduce(header.correlation_id, header.api_version, keys, self.nodes)
        for item, index in zip(batches, indexes, strict=True):
            item.owner, item.span = owner, span
            self._lane(node_id, principal, index).submit(item)
        return Submitted(owner.pending if owner is not None else None, raw=False)
