"""Which upstream broker node each local listener stands for.

Every upstream node id gets one local listener whose port is derived from the node id alone
(`node_port_base + node_id`), so the addresses kipside hands out stay the same across restarts
and across kipside replicas. The map learns nodes from the responses that carry addresses
(Metadata, FindCoordinator, DescribeCluster, NodeEndpoints) and asks the server to open a
listener the first time it sees one.

A node that a response listing every live broker (Metadata, DescribeCluster) no longer names
has left the cluster: the map marks it gone and tells the server, which ends what it has open
to that node but keeps the node's listener and port, so its address stays the same if the node
comes back (listed again: no longer gone). A node whose address changes is reported the same
way, so nothing stays connected to the old address. It must never dial anything itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kipside.protocol import Address

log = logging.getLogger("kipside.nodes")

NodeChanged = Callable[[int, str], None]
"""Told (node id, why) when a node leaves the cluster or moves to another address."""


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
        on_node_changed: NodeChanged | None = None,
    ) -> None:
        self.advertise_host = advertise_host
        self.node_port_base = node_port_base
        self._upstream: dict[int, Address] = {}
        self._local_port: dict[int, int] = {}
        self._gone: set[int] = set()
        self._on_new_node = on_new_node
        self._on_node_changed = on_node_changed

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
                self._changed(node_id, f"moved from {previous} to {upstream}")
        return self.local_address(node_id)

    def listed(self, node_ids: Iterable[int]) -> None:
        """A response listing every live broker named these: a known node it leaves out has
        left the cluster; a gone node it names is back. An empty list says nothing."""
        live = set(node_ids)
        if not live:
            return
        for node_id in sorted(live & self._gone):
            self._gone.discard(node_id)
            log.info("upstream node %d is back in the cluster metadata", node_id)
        for node_id in sorted(self._upstream.keys() - live - self._gone):
            self._gone.add(node_id)
            log.warning(
                "upstream node %d (%s) left the cluster: the brokers' metadata no longer lists "
                "it. Its listener stays on %s; clients that dial it are closed until it is back",
                node_id,
                self._upstream[node_id],
                self.local_address(node_id),
            )
            self._changed(node_id, "left the cluster (no longer in the brokers' metadata)")

    def _changed(self, node_id: int, why: str) -> None:
        if self._on_node_changed is not None:
            self._on_node_changed(node_id, why)

    def is_gone(self, node_id: int) -> bool:
        """The node left the cluster (see listed)."""
        return node_id in self._gone

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
        """Every node ever learned, gone ones included."""
        return dict(self._upstream)

    def live_nodes(self) -> dict[int, Address]:
        """The nodes learned and not gone."""
        return {n: a for n, a in self._upstream.items() if n not in self._gone}
