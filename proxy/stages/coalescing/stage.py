"""The coalescing stage: ProduceRequests to the lanes, or to the client's own connection.

The coalescer (this package) decides whether a request coalesces, by the rules; this stage
keeps a client's batches of one partition in order when its requests change route between the
lanes and its own connection (a rule that excludes some topics, a reload): the request on the
new route waits (a `Wait`) until the old route has answered that partition, or, for acks=0
batches, a barrier behind them.
"""

from __future__ import annotations

from typing import Final

from kipside.protocol import ApiKey
from kipside.proxy.core.decisions import FORWARD_OWN, ClientRequest, Decision, Take, Wait
from kipside.proxy.stages.coalescing.coalescer import Coalescer
from kipside.proxy.stages.coalescing.order import ProduceOrder
from kipside.proxy.stages.context import FeatureContext

__all__ = ["ORDER_WAIT_LIMIT_SECONDS", "CoalescingStage"]

ORDER_WAIT_LIMIT_SECONDS: Final = 30.0
"""How long a ProduceRequest changing route waits for the old route's answer: the clients'
usual request timeout, after which the client has given up on those requests itself."""


class CoalescingStage:
    api_keys = frozenset({ApiKey.PRODUCE})

    def __init__(self, context: FeatureContext, coalescer: Coalescer) -> None:
        self.context = context
        self.coalescer = coalescer
        self.order = ProduceOrder()

    def __call__(self, request: ClientRequest) -> Decision | None:
        header, client = request.header, request.client
        if header.api_key != ApiKey.PRODUCE or client.authenticated:
            return None
        node_id = self.context.node_for(client.node_id)
        order = self.order
        if node_id is None:
            order.sent_own(client, None, -1)
            return FORWARD_OWN
        coalescer = self.coalescer
        rules = self.context.rules()
        plan = coalescer.plan(request.frame, header, client.client_id, rules)
        earlier = order.earlier(client, plan.partitions, plan.coalesce)
        if earlier is not None:
            self.context.stats.produce_route_waits += 1
            route = "the lanes" if plan.coalesce else "its own broker connection"
            return Wait(
                earlier,
                ORDER_WAIT_LIMIT_SECONDS,
                f"a ProduceRequest moving to {route} waited {ORDER_WAIT_LIMIT_SECONDS:g} s for "
                "its earlier batches of the same partitions on the other route, unanswered; "
                "closing the connection so the client resends in order",
            )
        if not plan.coalesce:
            order.sent_own(client, plan.partitions, plan.acks)
            return FORWARD_OWN
        assert plan.partitions is not None
        taken = coalescer.take(
            plan,
            node_id,
            client.principal,
            request.frame,
            header,
            client,
            client.span,  # type: ignore[arg-type]
            request.received_at,
            rules.coalescing,
        )
        if taken.pending is None:
            order.sent_to_lanes_unanswered(client, taken.barriers)
        else:
            order.sent_to_lanes(client, plan.partitions, taken.pending)
        return Take(taken.pending, raw=taken.raw)
