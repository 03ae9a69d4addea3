"""The short-APIs stage: requests a broker answers at once go on a shared lane.

Metadata, FindCoordinator, ListOffsets and the like are answered straight away whatever else the
broker is doing, so they are safe to share a connection, their correlation ids remapped. APIs
that can park a connection (Fetch, JoinGroup, SyncGroup, ...) never come here: they would stall
every other client of the lane.
"""

from __future__ import annotations

from typing import Final

from kipside.protocol import ApiKey
from kipside.proxy.core.decisions import ClientRequest, Decision, ForwardLane
from kipside.proxy.stages.context import FeatureContext

__all__ = ["SHORT_APIS", "ShortApisStage"]

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


class ShortApisStage:
    api_keys = SHORT_APIS

    def __init__(self, context: FeatureContext) -> None:
        self.context = context

    def __call__(self, request: ClientRequest) -> Decision | None:
        client = request.client
        if request.header.api_key not in SHORT_APIS or client.authenticated:
            return None
        node_id = self.context.node_for(client.node_id)
        if node_id is None:
            return None
        return ForwardLane(self.context.pools(node_id, client.principal).short_lane())
