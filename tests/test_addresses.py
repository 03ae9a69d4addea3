"""Tests for proxy.addresses and proxy.nodes: no broker address ever reaches a client."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from kipside.protocol import Address
from kipside.protocol.apis import ApiKey, api_name
from kipside.protocol.errors import DecodeError
from kipside.protocol.headers import build_frame, encode_response_header, parse_response_header
from kipside.protocol.messages import (
    decode_response,
    encode_message,
    known_versions,
    response_class,
)
from kipside.proxy.upstream.addresses import AddressRewriter, address_apis, carries_addresses
from kipside.proxy.upstream.nodes import NodeMap, NodeMapError

ADVERTISE = "kipside.local"
PORT_BASE = 30000
# (node id, host, port, rack) as the broker advertises them.
Endpoint = tuple[int, str, int, str | None]
UPSTREAM: list[Endpoint] = [
    (1, "broker-1.internal", 9092, "rack-a"),
    (7, "broker-7.internal", 19092, None),
]

# Which field holds the endpoints, and what the node id is called in its entries.
ENDPOINT_FIELD = {
    ApiKey.METADATA: ("brokers", "node_id"),
    ApiKey.DESCRIBE_CLUSTER: ("brokers", "broker_id"),
    ApiKey.FIND_COORDINATOR: ("coordinators", "node_id"),  # v4+
    # KIP-951: the new leaders' endpoints, in the responses that can name a new leader.
    **dict.fromkeys(
        (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE),
        ("node_endpoints", "node_id"),
    ),
}
ZERO = i32Timedelta.parse(datetime.timedelta(0))
# Values for every required top-level field any of these responses has; _fit picks the ones
# a given class declares.
COMMON = {
    "throttle_time": ZERO,
    "acquisition_lock_timeout": ZERO,
    "error_code": ErrorCode.none,
    "error_message": None,
    "topics": (),
    "responses": (),
    "cluster_id": "cluster-1",
}


def _fit(cls: Any, **values: Any) -> Any:
    """Instantiate a kio class with those of `values` it has fields for."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _element_class(cls: Any, field_name: str) -> Any:
    (field,) = [f for f in dataclasses.fields(cls) if f.name == field_name]
    return typing.get_args(field.type)[0]


def build(api_key: int, version: int, endpoints: list[Endpoint]) -> Any:
    """A response of this API version listing these endpoints (and nothing else of note)."""
    cls = response_class(api_key, version)
    if api_key == ApiKey.FIND_COORDINATOR and version < 4:
        ((node_id, host, port, _rack),) = endpoints
        return _fit(cls, **COMMON, node_id=node_id, host=host, port=port)
    field_name, id_name = ENDPOINT_FIELD[ApiKey(api_key)]
    element = _element_class(cls, field_name)
    entries = tuple(
        _fit(
            element,
            **{id_name: node_id},
            host=host,
            port=port,
            rack=rack,
            key=f"group-{node_id}",
            error_code=ErrorCode.none,
            error_message=None,
            is_fenced=False,
        )
        for node_id, host, port, rack in endpoints
    )
    return _fit(cls, **COMMON, **{field_name: entries})


def local(endpoints: list[Endpoint]) -> list[Any]:
    return [(n, ADVERTISE, PORT_BASE + n, rack) for n, _host, _port, rack in endpoints]


def frame_of(api_key: int, version: int, message: Any, correlation_id: int = 5) -> bytes:
    header = encode_response_header(api_key, version, correlation_id)
    return build_frame(header, encode_message(message))


def decode_frame(api_key: int, version: int, frame: bytes) -> Any:
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    header = parse_response_header(frame, api_key, version)
    return decode_response(api_key, version, frame, header.body_offset)


class Recorder:
    def __init__(self) -> None:
        self.new_nodes: list[int] = []

    def __call__(self, node_id: int) -> None:
        self.new_nodes.append(node_id)


@pytest.fixture
def learned() -> Recorder:
    return Recorder()


@pytest.fixture
def nodes(learned: Recorder) -> NodeMap:
    return NodeMap(advertise_host=ADVERTISE, node_port_base=PORT_BASE, on_new_node=learned)


@pytest.fixture
def rewriter(nodes: NodeMap) -> AddressRewriter:
    return AddressRewriter(nodes)


def rewrite(rewriter: AddressRewriter, api_key: int, version: int, frame: bytes) -> bytes:
    header = parse_response_header(frame, api_key, version)
    return rewriter.rewrite(api_key, version, frame, header)


def _address_versions() -> list[tuple[int, int]]:
    out = []
    for api_key, first in address_apis().items():
        known = known_versions(api_key)
        assert known is not None, f"kio cannot decode {api_name(api_key)}"
        out += [(api_key, v) for v in range(max(first, known[0]), known[1] + 1)]
    return out


ADDRESS_VERSIONS = _address_versions()


def test_every_family_is_covered() -> None:
    families = {(k, v >= 4 if k == ApiKey.FIND_COORDINATOR else None) for k, v in ADDRESS_VERSIONS}
    assert families >= {
        (ApiKey.METADATA, None),
        (ApiKey.FIND_COORDINATOR, False),
        (ApiKey.FIND_COORDINATOR, True),
        (ApiKey.DESCRIBE_CLUSTER, None),
        (ApiKey.PRODUCE, None),
        (ApiKey.FETCH, None),
    }
    assert (ApiKey.PRODUCE, 10) in ADDRESS_VERSIONS
    assert (ApiKey.FETCH, 16) in ADDRESS_VERSIONS
    assert (ApiKey.PRODUCE, 9) not in ADDRESS_VERSIONS


@pytest.mark.parametrize(
    ("api_key", "version"),
    ADDRESS_VERSIONS,
    ids=[f"{api_name(k)}-v{v}" for k, v in ADDRESS_VERSIONS],
)
def test_addresses_rewritten_node_ids_kept(
    rewriter: AddressRewriter, nodes: NodeMap, learned: Recorder, api_key: int, version: int
) -> None:
    upstream = UPSTREAM[1:] if api_key == ApiKey.FIND_COORDINATOR and version < 4 else UPSTREAM
    frame = frame_of(api_key, version, build(api_key, version, upstream), correlation_id=-9)
    out = rewrite(rewriter, api_key, version, frame)

    assert out[4:8] == frame[4:8]  # correlation id
    # Everything but host and port is as the broker sent it (node ids, racks, the rest).
    assert decode_frame(api_key, version, out) == build(api_key, version, local(upstream))
    assert b"internal" not in out
    assert learned.new_nodes == [n for n, *_ in upstream]
    for node_id, host, port, _rack in upstream:
        assert nodes.upstream(node_id) == Address(host, port)
        assert nodes.local_address(node_id) == Address(ADVERTISE, PORT_BASE + node_id)


def test_response_header_tags_survive_the_rewrite(rewriter: AddressRewriter) -> None:
    body = encode_message(build(ApiKey.METADATA, 12, UPSTREAM))
    header = bytes.fromhex("0000002a010302cafe")  # corr 42, one unknown tag
    out = rewrite(rewriter, ApiKey.METADATA, 12, build_frame(header, body))
    assert out[4 : 4 + len(header)] == header
    assert decode_frame(ApiKey.METADATA, 12, out) == build(ApiKey.METADATA, 12, local(UPSTREAM))


def test_new_node_learned_once(
    rewriter: AddressRewriter, nodes: NodeMap, learned: Recorder
) -> None:
    node: list[Endpoint] = [(7, "broker-7.internal", 19092, None)]
    for api_key, version in [
        (ApiKey.METADATA, 12),
        (ApiKey.METADATA, 1),
        (ApiKey.FIND_COORDINATOR, 3),
        (ApiKey.FIND_COORDINATOR, 6),
        (ApiKey.DESCRIBE_CLUSTER, 1),
        (ApiKey.PRODUCE, 10),
    ]:
        rewrite(
            rewriter, api_key, version, frame_of(api_key, version, build(api_key, version, node))
        )
    assert learned.new_nodes == [7]
    assert nodes.nodes() == {7: Address("broker-7.internal", 19092)}


def test_moved_node_keeps_its_local_address(
    rewriter: AddressRewriter, nodes: NodeMap, learned: Recorder
) -> None:
    for host in ("old.internal", "new.internal"):
        message = build(ApiKey.METADATA, 12, [(7, host, 9092, None)])
        out = rewrite(rewriter, ApiKey.METADATA, 12, frame_of(ApiKey.METADATA, 12, message))
        broker = decode_frame(ApiKey.METADATA, 12, out).brokers[0]
        assert (broker.node_id, broker.host, broker.port) == (7, ADVERTISE, PORT_BASE + 7)
    assert learned.new_nodes == [7]
    assert nodes.upstream(7) == Address("new.internal", 9092)


def _list(rewriter: AddressRewriter, api_key: int, version: int, ids: list[int]) -> None:
    brokers = [e for e in [*UPSTREAM, (3, "broker-3.internal", 9092, None)] if e[0] in ids]
    frame = frame_of(api_key, version, build(api_key, version, brokers))
    rewrite(rewriter, api_key, version, frame)


@pytest.mark.parametrize(
    ("api_key", "version"), [(ApiKey.METADATA, 12), (ApiKey.DESCRIBE_CLUSTER, 1)]
)
def test_node_left_out_of_the_broker_list_has_left_until_listed_again(
    learned: Recorder, api_key: int, version: int
) -> None:
    changed: list[tuple[int, str]] = []
    nodes = NodeMap(
        advertise_host=ADVERTISE,
        node_port_base=PORT_BASE,
        on_new_node=learned,
        on_node_changed=lambda node_id, why: changed.append((node_id, why)),
    )
    rewriter = AddressRewriter(nodes)
    _list(rewriter, api_key, version, [1, 3, 7])
    _list(rewriter, ApiKey.FIND_COORDINATOR, 4, [1])  # names one node: says nothing of others
    _list(rewriter, api_key, version, [])  # an empty list says nothing either
    assert changed == [] and not nodes.is_gone(7)

    _list(rewriter, api_key, version, [1, 3])
    assert changed == [(7, "left the cluster (no longer in the brokers' metadata)")]
    assert nodes.is_gone(7) and set(nodes.live_nodes()) == {1, 3}
    assert nodes.local_address(7) == Address(ADVERTISE, PORT_BASE + 7)  # the port stays
    _list(rewriter, api_key, version, [1, 3])
    assert len(changed) == 1  # told once

    _list(rewriter, api_key, version, [1, 3, 7])
    assert not nodes.is_gone(7) and set(nodes.live_nodes()) == {1, 3, 7}
    assert sorted(learned.new_nodes) == [1, 3, 7] and len(changed) == 1


def test_moved_node_is_reported(learned: Recorder) -> None:
    changed: list[tuple[int, str]] = []
    nodes = NodeMap(
        advertise_host=ADVERTISE,
        node_port_base=PORT_BASE,
        on_node_changed=lambda node_id, why: changed.append((node_id, why)),
    )
    nodes.learn(7, "old.internal", 9092)
    nodes.learn(7, "old.internal", 9092)
    nodes.learn(7, "new.internal", 9092)
    assert changed == [(7, "moved from old.internal:9092 to new.internal:9092")]


def test_bound_listener_port_is_advertised(rewriter: AddressRewriter, nodes: NodeMap) -> None:
    nodes.bound(7, 45678)
    message = build(ApiKey.METADATA, 12, UPSTREAM)
    out = rewrite(rewriter, ApiKey.METADATA, 12, frame_of(ApiKey.METADATA, 12, message))
    ports = {b.node_id: b.port for b in decode_frame(ApiKey.METADATA, 12, out).brokers}
    assert ports == {1: PORT_BASE + 1, 7: 45678}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_error_placeholder_untouched(
    rewriter: AddressRewriter, nodes: NodeMap, learned: Recorder, version: int
) -> None:
    cls = response_class(ApiKey.FIND_COORDINATOR, version)
    message = _fit(
        cls,
        **{**COMMON, "error_code": ErrorCode.coordinator_not_available, "error_message": "wait"},
        node_id=-1,
        host="",
        port=-1,
    )
    frame = frame_of(ApiKey.FIND_COORDINATOR, version, message)
    assert rewrite(rewriter, ApiKey.FIND_COORDINATOR, version, frame) == frame
    assert learned.new_nodes == []
    assert nodes.nodes() == {}


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_v4_error_entries_untouched(
    rewriter: AddressRewriter, learned: Recorder, version: int
) -> None:
    cls = response_class(ApiKey.FIND_COORDINATOR, version)
    element = _element_class(cls, "coordinators")
    failed = element(
        key="group-a",
        node_id=-1,
        host="",
        port=-1,
        error_code=ErrorCode.coordinator_load_in_progress,
        error_message=None,
    )
    found = element(
        key="group-b",
        node_id=3,
        host="broker-3.internal",
        port=9092,
        error_code=ErrorCode.none,
        error_message=None,
    )
    message = _fit(cls, **COMMON, coordinators=(failed, found))
    out = rewrite(rewriter, ApiKey.FIND_COORDINATOR, version, frame_of(10, version, message))
    coordinators = decode_frame(ApiKey.FIND_COORDINATOR, version, out).coordinators
    assert coordinators[0] == failed
    assert coordinators[1] == dataclasses.replace(found, host=ADVERTISE, port=PORT_BASE + 3)
    assert learned.new_nodes == [3]


@pytest.mark.parametrize(("api_key", "version"), [(ApiKey.PRODUCE, 10), (ApiKey.FETCH, 16)])
def test_empty_node_endpoints_byte_identical(
    rewriter: AddressRewriter, learned: Recorder, api_key: int, version: int
) -> None:
    frame = frame_of(api_key, version, build(api_key, version, []))
    assert rewrite(rewriter, api_key, version, frame) == frame
    assert learned.new_nodes == []


def test_produce_v10_with_records_and_no_endpoints_byte_identical(
    rewriter: AddressRewriter,
) -> None:
    cls = response_class(ApiKey.PRODUCE, 10)
    partition: dict[str, Any] = {"index": 0, "error_code": ErrorCode.none, "base_offset": 41}
    partition |= {"log_append_time": None, "log_start_offset": 0, "record_errors": ()}
    topic = _one_topic(cls, "partition_responses", {"name": "orders"}, partition)
    message = _fit(cls, **{**COMMON, "responses": (topic,)})
    frame = frame_of(ApiKey.PRODUCE, 10, message)
    assert rewrite(rewriter, ApiKey.PRODUCE, 10, frame) == frame


def test_undecodable_response_is_never_passed_through(rewriter: AddressRewriter) -> None:
    frame = build_frame(encode_response_header(ApiKey.METADATA, 12, 1), b"\x00\x00\x00")
    with pytest.raises(DecodeError):
        rewrite(rewriter, ApiKey.METADATA, 12, frame)


def test_carries_addresses() -> None:
    assert carries_addresses(ApiKey.METADATA, 0)
    assert carries_addresses(ApiKey.FIND_COORDINATOR, 0)
    assert carries_addresses(ApiKey.DESCRIBE_CLUSTER, 0)
    assert not carries_addresses(ApiKey.PRODUCE, 9)
    assert carries_addresses(ApiKey.PRODUCE, 10)
    assert not carries_addresses(ApiKey.FETCH, 15)
    assert carries_addresses(ApiKey.FETCH, 16)
    assert not carries_addresses(ApiKey.HEARTBEAT, 4)
    assert not carries_addresses(1000, 0)


def test_node_port_outside_range_is_refused() -> None:
    nodes = NodeMap(advertise_host=ADVERTISE, node_port_base=65000)
    assert nodes.wanted_port(535) == 65535
    with pytest.raises(NodeMapError, match="65536"):
        nodes.wanted_port(536)
    assert NodeMap(advertise_host=ADVERTISE, node_port_base=None).wanted_port(5) == 0


def _fetch_with_records(version: int, endpoints: list[Endpoint]) -> Any:
    """A Fetch answer with one topic (by id from v13) and a partition holding bytes."""
    message = build(ApiKey.FETCH, version, endpoints)
    partition: dict[str, Any] = {
        "partition_index": 3,
        "error_code": ErrorCode.none,
        "high_watermark": 10,
    }
    partition |= {"aborted_transactions": None, "records": b"\x00" * 70}
    topic_id = {"topic_id": uuid.UUID(int=7)}
    topic = _one_topic(type(message), "partitions", topic_id, partition)
    return dataclasses.replace(message, responses=(topic,))


def _one_topic(cls: Any, partitions: str, topic: dict[str, Any], partition: dict[str, Any]) -> Any:
    """An entry of the response class's `responses` array: a topic with one partition."""
    topic_cls = _element_class(cls, "responses")
    partition_cls = _element_class(topic_cls, partitions)
    return _fit(topic_cls, **topic, **{partitions: (_fit(partition_cls, **partition),)})


@pytest.mark.parametrize("version", [16, 17])
def test_fetch_with_records_rewritten_only_when_it_names_nodes(
    rewriter: AddressRewriter, learned: Recorder, version: int
) -> None:
    """The fast check that skips the full decode reads past topics (by id) and records."""
    quiet = frame_of(ApiKey.FETCH, version, _fetch_with_records(version, []))
    assert rewrite(rewriter, ApiKey.FETCH, version, quiet) is quiet
    assert learned.new_nodes == []
    named = frame_of(ApiKey.FETCH, version, _fetch_with_records(version, UPSTREAM))
    out = rewrite(rewriter, ApiKey.FETCH, version, named)
    assert decode_frame(ApiKey.FETCH, version, out) == _fetch_with_records(version, local(UPSTREAM))
    assert learned.new_nodes == [n for n, *_ in UPSTREAM]
