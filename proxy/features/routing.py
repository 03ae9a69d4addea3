"""Which upstream connection carries each client request.

- ProduceRequests that may be coalesced go to the produce lanes (features.coalesce).
- Short request/response APIs are multiplexed over the node's lanes, correlation ids remapped.
- Transaction requests of rule-matched transactional ids go to features.transactions.
- Everything else, and every request of a client that authenticated with SASL, goes on the
  client's own upstream connection, opened lazily: APIs that can park a broker connection
  (Fetch, JoinGroup, SyncGroup, ...) must not stall other clients, and a SASL identity belongs
  to one connection. So a client that only produces costs the broker no connection of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kipside.protocol import ApiKey, RequestHeader
from kipside.proxy.features.coalesce import Coalescer
from kipside.proxy.features.context import FeatureContext
from kipside.proxy.features.transactions import TransactionManager
from kipside.proxy.network.hooks import Routed, RoutedClient

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


@dataclass(frozen=True, slots=True)
class Router:
    """The server's shared route (network.hooks.SharedRoute): the features in turn."""

    context: FeatureContext
    coalescer: Coalescer
    transactions: TransactionManager

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
            return None
        if self.transactions.active() and self.transactions.takes(header):
            answer = await self.transactions.route(
                node_id, session.principal, frame, header, session.client_id, session.current_span
            )
            if answer is not None:
                return Routed(answer, raw=False)
        if api_key == ApiKey.PRODUCE:
            if not self.coalescer.eligible(header):
                return None
            taken = self.coalescer.submit(
                node_id,
                session.principal,
                frame,
                header,
                session.client_id,
                session.disconnect,
                session.current_span,
            )
            if taken is None:
                return None
            return Routed(taken.pending, raw=taken.raw)
        if api_key in SHORT_APIS:
            pool = self.context.pools(node_id, session.principal)
            connection = await pool.connection(pool.next_short_lane())
            self.context.stats.upstream_requests[api_key] += 1
            return Routed(await connection.send(frame, api_key, header.api_version), raw=True)
        return None
