"""Which upstream broker node each local listener stands for.

Every upstream node id gets one local listener whose port is derived from the node id alone
(`node_port_base + node_id`), so the addresses kipside hands out stay the same across restarts
and across kipside replicas. The map learns nodes from the responses that carry addresses
(Metadata, FindCoordinator, DescribeCluster, NodeEndpoints) and asks the server to open a
listener the first time it sees one. It must never dial anything itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kipside.protocol import Address

log = logging.getLogger("kipside.nodes")


class NodeMapError(ValueError):
    """A node id cannot be given a local port (outside 1..65535)."""


class NodeMap:
    """Upstream node id -> (upstream address, local address)."""

    def __init__(
        self,
        *,
        advertise_host: str,
        node_port_base: int | None,
        on_new_node: Callable[[int], None] | None = None,
    ) -> None:
        self.advertise_host = advertise_host
        self.node_port_base = node_port_base
        self._upstream: dict[int, Address] = {}
        self._local_port: dict[int, int] = {}
        self._on_new_node = on_new_node

    def set_listener_callback(self, on_new_node: Callable[[int], None]) -> None:
        self._on_new_node = on_new_node

    def wanted_port(self, node_id: int) -> int:
        """The deterministic local port for a node (0 = any, when no base was configured)."""
        if self.node_port_base is None:
            return 0
        port = self.node_port_base + node_id
        if not 1 <= port <= 65535:
            raise NodeMapError(
                f"node {node_id} would listen on port {port}, outside 1..65535; "
                "choose --node-port-base so that base + node id is a valid port"
            )
        return port

    def learn(self, node_id: int, host: str, port: int) -> Address:
        """Record an upstream node's address; return the local address clients should use."""
        upstream = Address(host, port)
        previous = self._upstream.get(node_id)
        if previous != upstream:
            self._upstream[node_id] = upstream
            if previous is None:
                log.info("learned upstream node %d at %s", node_id, upstream)
                if self._on_new_node is not None:
                    self._on_new_node(node_id)
            else:
                log.info("upstream node %d moved from %s to %s", node_id, previous, upstream)
        return self.local_address(node_id)

    def bound(self, node_id: int, port: int) -> None:
        """The server bound the node's listener to this port."""
        self._local_port[node_id] = port

    def local_address(self, node_id: int) -> Address:
        port = self._local_port.get(node_id)
        if port is None:
            port = self.wanted_port(node_id)
        return Address(self.advertise_host, port)

    def upstream(self, node_id: int) -> Address | None:
        return self._upstream.get(node_id)

    def nodes(self) -> dict[int, Address]:
        return dict(self._upstream)
