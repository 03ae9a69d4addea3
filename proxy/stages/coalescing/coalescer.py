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
from kipside.proxy.core.produce_scheduler import Batch
from kipside.proxy.stages.coalescing.client_produce import Submitted
from kipside.proxy.stages.coalescing.lanes import ProduceLanes, QueuedBatch
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import CoalescingRules, RuleSet


class ProducePlan(NamedTuple):
    """How a ProduceRequest is to go upstream, decided by Coalescer.plan."""

    partitions: tuple[tuple[str, int], ...] | None
    """Its (topic, partition)s in request order; None: not read (coalescing is off with no
    rule to switch it on, or the version is not one kipside coalesces)."""
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
        self._lanes: dict[tuple[int, Principal], ProduceLanes] = {}

    @property
    def rules(self) -> CoalescingRules:
        """The coalescing rules in force; a reload changes them for requests from then on
        (the lane count of existing pools doesn't change)."""
        return self.context.rules().coalescing

    def lanes(self, node_id: int, principal: Principal) -> ProduceLanes:
        """The produce lanes to a node for a principal (their scheduler), made on first use."""
        key = (node_id, principal)
        lanes = self._lanes.get(key)
        if lanes is None:
            pool = self.context.pools(node_id, principal)
            lanes = self._lanes[key] = ProduceLanes(self.context, pool, self.nodes)
            self.context.nursery.start_soon(lanes.run)
        return lanes

    def outstanding(self) -> int:
        """Batches queued or in flight on every node's lanes."""
        return sum(lanes.scheduler.outstanding() for lanes in self._lanes.values())

    def plan(
        self, frame: bytes, header: RequestHeader, client_id: str | None, rules: RuleSet
    ) -> ProducePlan:
        """Whether this ProduceRequest coalesces under `rules` (those in force), and its
        partitions.

        Synchronous, and `take` after it must be too: a reload between them would split the
        request's decision from the rules that made it."""
        coalescing = rules.coalescing
        version = header.api_version
        if not PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION or not (
            coalescing.enabled or coalescing.rules  # a matching rule decides on its own
        ):
            return UNREAD
        request = parse_produce_request(
            frame, header.body_offset, version, rules.limits.decode_limits
        )
        partitions = request.partitions
        keys = tuple([(p.topic, p.partition) for p in partitions])
        acks = request.acks
        if request.transactional_id is not None or not partitions:
            return ProducePlan(keys, acks=acks)
        if len(keys) > 1 and len(set(keys)) != len(keys):
            return ProducePlan(keys, acks=acks)  # the broker answers malformed requests itself
        for p in partitions:
            if p.records is None or (
                coalescing.rules and not coalescing.applies(p.topic, client_id or "")
            ):
                return ProducePlan(keys, acks=acks)
        return ProducePlan(keys, True, partitions, acks, request.timeout_ms)

    def take(
        self,
        plan: ProducePlan,
        node_id: int,
        principal: Principal,
        frame: bytes,
        header: RequestHeader,
        client: ClientHandle,
        span: Span | None,
        now: float,
        rules: CoalescingRules,
    ) -> Submitted:
        """Take a planned request's batches: passed through unchanged to an idle lane, or
        queued. Raises UpstreamFailed if a passed-through request's connection breaks."""
        assert plan.partitions is not None and plan.coalesce
        acks, timeout_ms = plan.acks, plan.timeout_ms
        batches = [
            Batch(
                client,
                p.topic,
                p.partition,
                len(p.records) if p.records is not None else 0,
                acks,
                timeout_ms,
                QueuedBatch(p, None, client, span),
            )
            for p in plan.batches
        ]
        return self.lanes(node_id, principal).submit(batches, frame, header, acks, now, rules)
