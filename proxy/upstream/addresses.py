"""Rewrite every broker address in responses so clients only ever dial kipside.

Covers Metadata Brokers[], FindCoordinator (v0-3 top level, v4+ Coordinators[]),
DescribeCluster Brokers[], and the NodeEndpoints of Produce v10+, Fetch v16+, ShareFetch and
ShareAcknowledge. Each upstream node keeps its node id; only host and port change, to the node's
local listener. Metadata and DescribeCluster list every live broker, so they also tell the node
map which nodes have left the cluster. A response whose addresses can't be decoded is never
passed through (that would leak a broker address): the caller fails the connection instead.
Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from kipside.protocol import (
    INT32,
    ApiKey,
    DecodeError,
    Message,
    ResponseHeader,
    decode_response,
    encode_message,
    fetch_response_names_nodes,
    produce_response_names_nodes,
)
from kipside.proxy.upstream.nodes import NodeMap

# Lowest version whose response carries addresses; below it the response passes untouched.
_FIRST_VERSION_WITH_ADDRESSES: Final[dict[int, int]] = {
    ApiKey.PRODUCE: 10,
    ApiKey.FETCH: 16,
    ApiKey.METADATA: 0,
    ApiKey.FIND_COORDINATOR: 0,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.SHARE_FETCH: 0,
    ApiKey.SHARE_ACKNOWLEDGE: 0,
}


_BROKERS: Final = 1  # DescribeCluster's endpoint type for brokers (2: controllers)


def carries_addresses(api_key: int, api_version: int) -> bool:
    first = _FIRST_VERSION_WITH_ADDRESSES.get(api_key)
    return first is not None and api_version >= first


def address_apis() -> dict[int, int]:
    """API key -> first version kipside must decode to rewrite addresses."""
    return dict(_FIRST_VERSION_WITH_ADDRESSES)


def _may_name_nodes(api_key: int, api_version: int, frame: bytes, body_offset: int) -> bool:
    """Whether a Produce or Fetch answer may carry node endpoints, by kipside's own fast
    readers (a full decode costs far more, and nearly every answer carries none)."""
    try:
        if api_key == ApiKey.PRODUCE:
            return produce_response_names_nodes(frame, body_offset, api_version)
        return fetch_response_names_nodes(frame, body_offset, api_version)
    except DecodeError:
        return True  # e.g. a version the fast readers don't know: the full decode decides


class AddressRewriter:
    def __init__(self, nodes: NodeMap) -> None:
        self._nodes = nodes

    def _endpoint(self, entry: Any, id_field: str = "node_id") -> Any:
        node_id = int(getattr(entry, id_field))
        if node_id < 0 or entry.port < 0:
            return entry  # "no coordinator" / "no leader" placeholders stay as they are
        local = self._nodes.learn(node_id, entry.host, int(entry.port))
        return dataclasses.replace(entry, host=local.host, port=type(entry.port)(local.port))

    def _endpoints(self, entries: tuple[Any, ...], id_field: str = "node_id") -> tuple[Any, ...]:
        return tuple(self._endpoint(e, id_field) for e in entries)

    def rewrite_message(self, api_key: int, message: Message) -> Message:
        if api_key == ApiKey.METADATA:
            brokers = self._endpoints(message.brokers)
            self._nodes.listed(int(b.node_id) for b in message.brokers)
            return dataclasses.replace(message, brokers=brokers)
        if api_key == ApiKey.FIND_COORDINATOR:
            if hasattr(message, "coordinators"):
                return dataclasses.replace(
                    message, coordinators=self._endpoints(message.coordinators)
                )
            return self._endpoint(message)
        if api_key == ApiKey.DESCRIBE_CLUSTER:
            brokers = self._endpoints(message.brokers, "broker_id")
            if getattr(message, "endpoint_type", _BROKERS) == _BROKERS:  # not KIP-919's controllers
                self._nodes.listed(int(b.broker_id) for b in message.brokers)
            return dataclasses.replace(message, brokers=brokers)
        if not message.node_endpoints:
            return message
        return dataclasses.replace(message, node_endpoints=self._endpoints(message.node_endpoints))

    def rewrite(
        self, api_key: int, api_version: int, frame: bytes, header: ResponseHeader
    ) -> bytes:
        """The response frame with local addresses; raises DecodeError if it can't be read."""
        if api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and not _may_name_nodes(
            api_key, api_version, frame, header.body_offset
        ):
            return frame  # the usual case: no leader change to report, nothing to rewrite
        message = decode_response(api_key, api_version, frame, header.body_offset)
        rewritten = self.rewrite_message(api_key, message)
        if rewritten is message:
            return frame
        body = encode_message(rewritten)
        head = frame[4 : header.body_offset]
        return INT32.pack(len(head) + len(body)) + head + body


RewriteFn = Callable[[int, int, bytes, ResponseHeader], bytes]
