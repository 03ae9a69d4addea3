"""Which upstream connection carries each client request.

- ProduceRequests that may be coalesced go to the produce lanes (features.coalesce), the others
  to the client's own connection; a partition changing route first waits for the client's
  earlier batches of it on the old route to be answered (features.coalesce.order).
- Short request/response APIs are multiplexed over the node's lanes, correlation ids remapped.
- Transaction requests of rule-matched transactional ids go to features.transactions.
- Everything else, and every request of a client that authenticated with SASL, goes on the
  client's own upstream connection, opened lazily: APIs that can park a broker connection
  (Fetch, JoinGroup, SyncGroup, ...) must not stall other clients, and a SASL identity belongs
  to one connection. So a client that only produces costs the broker no connection of its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Final

import trio

from kipside.protocol import ApiKey, RequestHeader
from kipside.proxy.core.answers import UpstreamFailed
from kipside.proxy.stages.coalescing import Coalescer, ProduceOrder, ProducePlan
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.stages.hooks import Routed, RoutedClient
from kipside.proxy.stages.transactions import TransactionManager
from kipside.proxy.upstream.connection import answer_of

log = logging.getLogger("kipside.coalesce")

# Answered by the broker straight away, whatever else is going on: safe to share a connection.
SHORT_APIS: Final = frozenset(
    {
        ApiKey.API_VERSIONS,
        ApiKey.METADATA,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.FIND_COORDINATOR,
        ApiKey.LIST_OFFSETS,
        ApiKey.OFFSET_FETCH,
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.DESCRIBE_GROUPS,
        ApiKey.LIST_GROUPS,
        ApiKey.DESCRIBE_PRODUCERS,
        ApiKey.DESCRIBE_TRANSACTIONS,
        ApiKey.LIST_TRANSACTIONS,
        ApiKey.DESCRIBE_ACLS,
        ApiKey.DESCRIBE_LOG_DIRS,
        ApiKey.DESCRIBE_CLIENT_QUOTAS,
        # KIP-714 client metrics: librdkafka >= 2.5 sends GetTelemetrySubscriptions on every
        # connection by default; the broker keys telemetry by client instance id, not by
        # connection, and answers at once.
        ApiKey.GET_TELEMETRY_SUBSCRIPTIONS,
        ApiKey.PUSH_TELEMETRY,
    }
)
SASL_APIS: Final = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

ORDER_WAIT_LIMIT_SECONDS: Final = 30.0
"""How long a ProduceRequest changing route waits for the old route's answer: the clients'
usual request timeout, after which the client has given up on those requests itself."""


@dataclass(frozen=True, slots=True)
class Router:
    """The server's shared route (network.hooks.SharedRoute): the features in turn."""

    context: FeatureContext
    coalescer: Coalescer
    transactions: TransactionManager
    order: ProduceOrder = field(default_factory=ProduceOrder)

    async def route(
        self, session: RoutedClient, frame: bytes, header: RequestHeader
    ) -> Routed | None:
        """Take the request onto a shared connection, or return None to forward it on the
        session's own connection."""
        api_key = header.api_key
        if api_key in SASL_APIS:
            session.authenticated = True
        if session.authenticated:
            return None
        node_id = self.context.node_for(session.node_id)
        if node_id is None:
            if api_key == ApiKey.PRODUCE:
                self.order.sent_own(session, None)
            return None
        if self.transactions.active() and self.transactions.takes(header):
            answer = await self.transactions.route(
                node_id, session.principal, frame, header, session.client_id, session.current_span
            )
            if answer is not None:
                return Routed(answer, raw=False)
        if api_key == ApiKey.PRODUCE:
            return await self._produce(session, frame, header, node_id)
        if api_key in SHORT_APIS:
            pool = self.context.pools(node_id, session.principal)
            connection = await pool.connection(pool.next_short_lane())
            self.context.stats.upstream_requests[api_key] += 1
            return Routed(await connection.send(frame, api_key, header.api_version), raw=True)
        return None

    async def _produce(
        self, session: RoutedClient, frame: bytes, header: RequestHeader, node_id: int
    ) -> Routed | None:
        """A ProduceRequest to the lanes, or None for the client's own connection, once the
        partitions it moves from one to the other are answered there."""
        order, coalescer = self.order, self.coalescer
        while True:
            plan = coalescer.plan(frame, header, session.client_id)
            earlier = order.earlier(session, plan.partitions, plan.coalesce)
            if earlier is None:
                break
            await self._wait_for_route(session, plan, partial(answer_of, earlier))
            # Decided again: the rules may have changed meanwhile.
        if not plan.coalesce:
            order.sent_own(session, plan.partitions)
            return None
        assert plan.partitions is not None
        taken = coalescer.take(
            plan,
            node_id,
            session.principal,
            frame,
            header,
            session.disconnect,
            session.current_span,
        )
        order.sent_to_lanes(session, plan.partitions, taken.pending)
        return Routed(taken.pending, raw=taken.raw)

    async def _wait_for_route(
        self, session: RoutedClient, plan: ProducePlan, answered: Callable[[], Awaitable[bytes]]
    ) -> None:
        self.context.stats.produce_route_waits += 1
        with trio.move_on_after(ORDER_WAIT_LIMIT_SECONDS) as limit:
            # A failed answer closes that route's clients; nothing is left to overtake then.
            with contextlib.suppress(UpstreamFailed):
                await answered()
        if limit.cancelled_caught:
            route = "the lanes" if plan.coalesce else "its own broker connection"
            log.warning(
                "%s: a ProduceRequest moving to %s waited %g s for its earlier batches of the "
                "same partitions on the other route, unanswered; closing the connection so the "
                "client resends in order",
                session.describe(),
                route,
                ORDER_WAIT_LIMIT_SECONDS,
            )
            raise UpstreamFailed("earlier produce requests on the other route went unanswered")
