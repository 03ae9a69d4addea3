"""One client's ProduceRequest as the coalescer took it, and the answer it gets back.

The answer lists exactly the client's partitions, in its order, under its correlation id and
request version, with the largest throttle time and the node endpoints of the leaders its
partitions' answers name (rewritten to kipside's listeners). It is built once the last
partition is answered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from kipside.protocol import (
    ApiKey,
    NodeEndpointData,
    PartitionResult,
    ProduceResponseData,
    build_frame,
    encode_produce_response,
    encode_response_header,
    error_name,
)
from kipside.proxy.core.answers import Pending
from kipside.proxy.upstream.nodes import NodeMap


class Submitted(NamedTuple):
    """How the coalescer took a ProduceRequest."""

    pending: Pending | None
    """The client's answer; None for acks=0 (nothing is owed)."""
    raw: bool
    """The answer is the broker's own frame (passed through), still to be rewritten."""
    barriers: Mapping[tuple[str, int], Callable[[], Pending]] = {}
    """acks=0: per partition, the barrier of the lane its batch took (what a later batch of
    that partition on another route waits for)."""


class ClientProduce:
    """One client's ProduceRequest, answered once every one of its partitions is."""

    __slots__ = (
        "correlation_id",
        "endpoints",
        "nodes",
        "order",
        "pending",
        "remaining",
        "results",
        "throttle_ms",
        "version",
    )

    def __init__(
        self, correlation_id: int, version: int, order: list[tuple[str, int]], nodes: NodeMap
    ) -> None:
        self.correlation_id = correlation_id
        self.version = version
        self.order = order
        self.nodes = nodes
        self.results: dict[tuple[str, int], PartitionResult] = {}
        self.remaining = len(order)
        self.throttle_ms = 0
        self.endpoints: dict[int, NodeEndpointData] = {}
        self.pending = Pending()

    def answer(
        self,
        result: PartitionResult,
        throttle_ms: int = 0,
        endpoints: tuple[NodeEndpointData, ...] = (),
    ) -> None:
        key = (result.topic, result.partition)
        if key in self.results:
            return
        self.results[key] = result
        self.throttle_ms = max(self.throttle_ms, throttle_ms)
        for endpoint in endpoints:
            self.endpoints[endpoint.node_id] = endpoint
        if result.error_code != 0 and self.pending.error_name is None:
            self.pending.error_name = error_name(result.error_code)
        self.remaining -= 1
        if self.remaining == 0:
            self.pending.resolve(self._frame())

    def _frame(self) -> bytes:
        # Only the leaders this client's partitions name: the upstream answer carried other
        # clients' partitions too, and a broker lists just the leaders of what it answers.
        leaders = {r.current_leader[0] for r in self.results.values() if r.current_leader}
        endpoints = []
        for e in self.endpoints.values():
            if e.node_id not in leaders:
                continue
            local = self.nodes.learn(e.node_id, e.host, e.port)
            endpoints.append(NodeEndpointData(e.node_id, local.host, local.port, e.rack))
        response = ProduceResponseData(
            tuple(self.results[key] for key in self.order), self.throttle_ms, tuple(endpoints)
        )
        header = encode_response_header(ApiKey.PRODUCE, self.version, self.correlation_id)
        return build_frame(header, encode_produce_response(self.version, response))
