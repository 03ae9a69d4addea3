"""Tests for protocol.fetch's requests: the hand-written Fetch v4-v12 encoder against kio, an
independent codec. Requests are encoded here and decoded by kio, which must see exactly the
FetchRequest a consumer sends. Responses are tested in test_fetch.py.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from fetch_kit import VERSIONS, int32, int64, names
from hypothesis import given, settings
from hypothesis import strategies as st

from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import DecodeError
from kipside.protocol.fetch import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FetchPartition,
    encode_fetch_request,
)
from kipside.protocol.messages import build_request, decode_request

# ---- requests -----------------------------------------------------------------------------


def decode(version: int, body: bytes) -> Any:
    return decode_request(ApiKey.FETCH, version, body, 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_request_decoded_by_kio(version: int) -> None:
    partitions = [
        FetchPartition("orders", 0, 100, 1 << 20),
        FetchPartition("tópico", 7, 2**40, 4096),
        FetchPartition("orders", 2, 0, 65536),
    ]
    request = decode(version, encode_fetch_request(version, partitions, **SETTINGS))

    assert request.replica_id == -1  # a consumer, not a follower
    assert request.max_wait.total_seconds() == 0.5
    assert (request.min_bytes, request.max_bytes) == (1, 50 << 20)
    assert request.isolation_level == READ_COMMITTED
    # Partitions are grouped by topic, topics in first-seen order, partitions as given.
    assert [t.topic for t in request.topics] == ["orders", "tópico"]
    orders, other = request.topics
    assert [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in orders.partitions] == [
        (0, 100, 1 << 20),
        (2, 0, 65536),
    ]
    assert [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in other.partitions] == [
        (7, 2**40, 4096)
    ]
    # Fields for followers or later fetches, wherever the version has them: -1, "unknown".
    for name in ("current_leader_epoch", "last_fetched_epoch", "log_start_offset"):
        for p in (*orders.partitions, *other.partitions):
            assert getattr(p, name, -1) == -1, name
    if version >= 7:  # sessionless (KIP-227): session 0, full fetch epoch -1, nothing forgotten
        assert (request.session_id, request.session_epoch) == (0, -1)
        assert request.forgotten_topics_data == ()
    else:
        assert not hasattr(request, "session_id")
    if version >= 11:
        assert request.rack_id == "rack-a"
    else:
        assert not hasattr(request, "rack_id")
    if version >= 12:
        assert request.cluster_id is None
    # And nothing else: every field equals kio's own entity built from the same description.
    assert request == expected_request(version, partitions, SETTINGS)


class FetchSettings(TypedDict):
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    rack_id: str


SETTINGS = FetchSettings(
    max_wait_ms=500,
    min_bytes=1,
    max_bytes=50 << 20,
    isolation_level=READ_COMMITTED,
    rack_id="rack-a",
)


def expected_request(version: int, partitions: list[FetchPartition], knobs: FetchSettings) -> Any:
    """The FetchRequest a consumer sends, as kio builds it: topics in first-seen order."""
    topics: dict[str, list[dict[str, int]]] = {}
    for p in partitions:
        topics.setdefault(p.topic, []).append(
            {
                "partition": p.partition,
                "current_leader_epoch": -1,
                "fetch_offset": p.fetch_offset,
                "last_fetched_epoch": -1,
                "log_start_offset": -1,
                "partition_max_bytes": p.partition_max_bytes,
            }
        )
    fields = {
        "replica_id": -1,
        "max_wait": knobs["max_wait_ms"],
        "min_bytes": knobs["min_bytes"],
        "max_bytes": knobs["max_bytes"],
        "isolation_level": knobs["isolation_level"],
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        "forgotten_topics_data": [],
        "rack_id": knobs["rack_id"],
    }
    return build_request(ApiKey.FETCH, version, fields)


@settings(deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    partitions=st.lists(st.builds(FetchPartition, names, int32, int64, int32), max_size=6),
    knobs=st.builds(
        FetchSettings,
        max_wait_ms=st.integers(0, 2**31 - 1),
        min_bytes=int32,
        max_bytes=int32,
        isolation_level=st.sampled_from([READ_UNCOMMITTED, READ_COMMITTED]),
        rack_id=names | st.just(""),
    ),
)
def test_request_round_trip(
    version: int, partitions: list[FetchPartition], knobs: FetchSettings
) -> None:
    body = encode_fetch_request(version, partitions, **knobs)
    assert decode(version, body) == expected_request(version, partitions, knobs)


@pytest.mark.parametrize("version", [0, 3, 13, 17])
def test_request_version_outside_range(version: int) -> None:
    with pytest.raises(DecodeError, match=rf"Fetch v{version} is outside the v4-v12 range"):
        encode_fetch_request(
            version, [], max_wait_ms=0, min_bytes=1, max_bytes=1, isolation_level=0
        )
