"""Tests for protocol.client: a ClientConnection wired to a fake broker, with no sockets.

As h11's tests do, the bytes one side produces are fed straight to the other. The fake broker is
made of protocol.framing and protocol.headers only, so it shares no code with the client's
correlation bookkeeping.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kipside.protocol import Buffer
from kipside.protocol.apis import ApiKey
from kipside.protocol.client import ClientConnection, Response, VersionRange, pick_version
from kipside.protocol.errors import FrameError, ProtocolError, UnsupportedVersionError
from kipside.protocol.fetch import FetchPartition, encode_fetch_request, parse_fetch_response
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.headers import (
    RequestHeader,
    build_frame,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_correlation_id,
)
from kipside.protocol.messages import (
    build,
    build_request,
    decode_request,
    encode_message,
    response_class,
)


class FakeBroker:
    """Reads request frames and answers them with whatever body a test gives."""

    def __init__(self) -> None:
        self._decoder = FrameDecoder()
        self.requests: list[tuple[RequestHeader, bytes]] = []

    def receive(self, chunks: Sequence[Buffer]) -> None:
        for chunk in chunks:
            self._decoder.receive_data(chunk)
        while (frame := self._decoder.next_frame()) is not None:
            self.requests.append((parse_request_header(frame), frame))

    def answer(self, index: int, body: bytes, *, correlation_id: int | None = None) -> bytes:
        header, _ = self.requests[index]
        cid = header.correlation_id if correlation_id is None else correlation_id
        return build_frame(encode_response_header(header.api_key, header.api_version, cid), body)


def api_versions_body(version: int) -> bytes:
    fields: dict[str, Any] = {
        "error_code": 0,
        "api_keys": [
            {"api_key": ApiKey.FETCH, "min_version": 4, "max_version": 17},
            {"api_key": ApiKey.METADATA, "min_version": 0, "max_version": 13},
        ],
        "throttle_time": 0,
    }
    return encode_message(build(response_class(ApiKey.API_VERSIONS, version), fields))


def metadata_request() -> Any:
    return build_request(
        ApiKey.METADATA,
        12,
        {
            "topics": [{"topic_id": None, "name": "orders"}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": True,
        },
    )


def metadata_body() -> bytes:
    fields = {
        "throttle_time": 3,
        "brokers": [{"node_id": 1, "host": "b1", "port": 9092, "rack": None}],
        "cluster_id": "c",
        "controller_id": 1,
        "topics": [],
    }
    return encode_message(build(response_class(ApiKey.METADATA, 12), fields))


def fetch_body(records: bytes) -> bytes:
    topic = {
        "topic": "orders",
        "partitions": [
            {
                "partition_index": 0,
                "error_code": 0,
                "high_watermark": 1,
                "aborted_transactions": None,
                "records": records,
            }
        ],
    }
    fields = {"throttle_time": 0, "error_code": 0, "responses": [topic]}
    return encode_message(build(response_class(ApiKey.FETCH, 12), fields))


def drain(client: ClientConnection) -> list[Response]:
    out = []
    while (response := client.next_response()) is not None:
        out.append(response)
    return out


# ---- requests out -------------------------------------------------------------------------


@pytest.mark.parametrize("client_id", ["kipside-mirror", "", None])
def test_requests_reach_the_broker(client_id: str | None) -> None:
    client = ClientConnection(client_id)
    broker = FakeBroker()
    fetch = encode_fetch_request(
        12,
        [FetchPartition("orders", 0, 5, 1024)],
        max_wait_ms=1,
        min_bytes=1,
        max_bytes=1,
        isolation_level=1,
    )
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b""))
    broker.receive(client.send_message(metadata_request()))
    broker.receive(client.send_request(ApiKey.FETCH, 12, fetch))
    assert client.in_flight == 3

    seen = [(h.api_key, h.api_version, h.correlation_id, h.client_id) for h, _ in broker.requests]
    assert seen == [
        (ApiKey.API_VERSIONS, 0, 0, client_id),
        (ApiKey.METADATA, 12, 1, client_id),
        (ApiKey.FETCH, 12, 2, client_id),
    ]
    assert [h.header_version for h, _ in broker.requests] == [1, 2, 2]
    (versions, empty), (meta, meta_frame), (fetch_header, fetch_frame) = broker.requests
    assert len(empty) == versions.body_offset  # an empty body
    assert decode_request(ApiKey.METADATA, 12, meta_frame, meta.body_offset) == metadata_request()
    assert fetch_frame[fetch_header.body_offset :] == fetch


def test_body_chunks_are_not_copied() -> None:
    client = ClientConnection("c")
    records = memoryview(bytearray(b"r" * 1000))
    head = b"\x00\x01"
    chunks = client.send_request(ApiKey.PRODUCE, 9, [head, records])
    assert chunks[1] is head and chunks[2] is records
    assert int.from_bytes(chunks[0][:4], "big") == sum(len(c) for c in chunks) - 4


# ---- responses in -------------------------------------------------------------------------


def three_exchanges() -> tuple[ClientConnection, list[bytes]]:
    """A client with three requests in flight and the broker's three answer frames."""
    client = ClientConnection("c")
    broker = FakeBroker()
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 3, b"\x02a\x021\x00"))
    broker.receive(client.send_message(metadata_request()))
    broker.receive(client.send_request(ApiKey.FETCH, 12, b""))
    answers = [
        broker.answer(0, api_versions_body(3)),
        broker.answer(1, metadata_body()),
        broker.answer(2, fetch_body(b"\xaa" * 70)),
    ]
    return client, answers


def check_three(responses: list[Response]) -> None:
    assert [(r.api_key, r.api_version, r.correlation_id) for r in responses] == [
        (ApiKey.API_VERSIONS, 3, 0),
        (ApiKey.METADATA, 12, 1),
        (ApiKey.FETCH, 12, 2),
    ]
    versions, metadata, fetch = responses
    # ApiVersions answers with response header v0 even at a flexible version (KIP-511).
    assert versions.body_offset == 8
    assert [(k.api_key, k.max_version) for k in versions.decode().api_keys] == [(1, 17), (3, 13)]
    assert metadata.body_offset == 9
    assert metadata.decode().brokers[0].host == "b1"
    data = parse_fetch_response(fetch.frame, fetch.body_offset, fetch.api_version)
    assert bytes(data.partitions[0].records) == b"\xaa" * 70


def test_responses_in_one_chunk() -> None:
    client, answers = three_exchanges()
    client.receive_data(b"".join(answers))
    check_three(drain(client))
    assert client.in_flight == 0
    assert client.next_response() is None


def test_responses_byte_by_byte() -> None:
    client, answers = three_exchanges()
    stream = b"".join(answers)
    ends = list(itertools.accumulate(len(a) for a in answers))
    got: list[Response] = []
    for i in range(len(stream)):
        client.receive_data(memoryview(stream)[i : i + 1])
        got += drain(client)
        # A response comes out exactly when its last byte arrives.
        assert len(got) == sum(1 for end in ends if end <= i + 1)
        assert client.in_flight == 3 - len(got)
    check_three(got)


@settings(deadline=None)
@given(
    apis=st.lists(
        st.sampled_from([(ApiKey.API_VERSIONS, 3), (ApiKey.METADATA, 12), (ApiKey.FETCH, 4)]),
        min_size=1,
        max_size=6,
    ),
    data=st.data(),
)
def test_any_chunking_of_any_exchange(apis: list[tuple[int, int]], data: st.DataObject) -> None:
    client = ClientConnection(None)
    broker = FakeBroker()
    for api_key, version in apis:
        broker.receive(client.send_request(api_key, version, b""))
    bodies = [data.draw(st.binary(max_size=50), label="body") for _ in apis]
    stream = b"".join(broker.answer(i, body) for i, body in enumerate(bodies))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10), label="cuts"))
    got: list[Response] = []
    for start, end in itertools.pairwise([0, *cuts, len(stream)]):
        client.receive_data(stream[start:end])
        got += drain(client)
    assert [(r.api_key, r.api_version, r.correlation_id) for r in got] == [
        (api_key, version, i) for i, (api_key, version) in enumerate(apis)
    ]
    assert [r.frame[r.body_offset :] for r in got] == bodies
    assert client.in_flight == 0


# ---- a broker that breaks the rules -------------------------------------------------------


def test_out_of_order_response() -> None:
    client = ClientConnection("c")
    broker = FakeBroker()
    broker.receive(client.send_message(metadata_request()))
    broker.receive(client.send_request(ApiKey.FETCH, 12, b""))
    with pytest.raises(
        ProtocolError,
        match=r"answered correlation id 1 while Metadata v12 with correlation id 0 was the oldest",
    ):
        client.receive_data(broker.answer(1, fetch_body(b"")))


@pytest.mark.parametrize("wrong", [-1, 7, 2**31 - 1])
def test_unknown_correlation_id(wrong: int) -> None:
    client = ClientConnection("c")
    broker = FakeBroker()
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b""))
    with pytest.raises(
        ProtocolError, match=rf"answered correlation id {wrong} while ApiVersions v0"
    ):
        client.receive_data(broker.answer(0, api_versions_body(0), correlation_id=wrong))


def test_response_to_no_request() -> None:
    client = ClientConnection("c")
    with pytest.raises(ProtocolError, match=r"response to no request"):
        client.receive_data(build_frame(b"\x00\x00\x00\x00", b"\x00\x00"))


def test_extra_response_after_the_answered_ones() -> None:
    client = ClientConnection("c")
    broker = FakeBroker()
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b""))
    answer = broker.answer(0, api_versions_body(0))
    client.receive_data(answer)
    assert client.next_response() is not None
    with pytest.raises(ProtocolError, match=r"response to no request"):
        client.receive_data(answer)


def test_frame_over_the_cap() -> None:
    client = ClientConnection("c", max_frame_bytes=64)
    client.send_request(ApiKey.API_VERSIONS, 0, b"")
    with pytest.raises(FrameError, match="exceeds the 64-byte cap"):
        client.receive_data((65).to_bytes(4, "big"))


# ---- correlation ids ----------------------------------------------------------------------


def test_correlation_ids_wrap_at_int32_max() -> None:
    client = ClientConnection("c")
    client._next_id = 2**31 - 2  # no public way to get there short of 2**31 requests
    broker = FakeBroker()
    for _ in range(4):
        broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b""))
    ids = [h.correlation_id for h, _ in broker.requests]
    assert ids == [2**31 - 2, 2**31 - 1, 0, 1]
    client.receive_data(b"".join(broker.answer(i, api_versions_body(0)) for i in range(4)))
    assert [r.correlation_id for r in drain(client)] == ids


# ---- pick_version -------------------------------------------------------------------------

BROKER: dict[int, VersionRange] = {
    ApiKey.FETCH: VersionRange(0, 17),
    ApiKey.METADATA: VersionRange(0, 8),
    ApiKey.PRODUCE: VersionRange(9, 12),
}


@pytest.mark.parametrize(
    ("api_key", "ours", "expected"),
    [
        (ApiKey.FETCH, VersionRange(4, 12), 12),  # ours is lower
        (ApiKey.METADATA, VersionRange(1, 12), 8),  # theirs is lower
        (ApiKey.PRODUCE, VersionRange(3, 9), 9),  # the overlap is one version
        (ApiKey.PRODUCE, VersionRange(12, 12), 12),
    ],
)
def test_pick_version(api_key: int, ours: VersionRange, expected: int) -> None:
    assert pick_version(api_key, BROKER, ours, broker_name="broker 1") == expected


@pytest.mark.parametrize(
    ("api_key", "ours", "message"),
    [
        (
            ApiKey.PRODUCE,
            VersionRange(3, 8),
            r"^broker 1 offers Produce v9-v12, kipside speaks v3-v8: no version in common$",
        ),
        (
            ApiKey.METADATA,
            VersionRange(9, 12),
            r"^broker 1 offers Metadata v0-v8, kipside speaks v9-v12: no version in common$",
        ),
        (
            ApiKey.LIST_OFFSETS,
            VersionRange(1, 7),
            r"^broker 1 does not offer ListOffsets \(api key 2\); kipside needs v1-v7$",
        ),
    ],
)
def test_pick_version_without_overlap(api_key: int, ours: VersionRange, message: str) -> None:
    with pytest.raises(UnsupportedVersionError, match=message):
        pick_version(api_key, BROKER, ours, broker_name="broker 1")


def test_unsupported_version_is_a_protocol_error() -> None:
    assert issubclass(UnsupportedVersionError, ProtocolError)


# ------------------------------------------- a proxy's use: other frames, tags, time


def heartbeat_frame(correlation_id: int) -> bytes:
    header = encode_request_header(ApiKey.HEARTBEAT, 0, correlation_id, "client")
    return build_frame(header, b"\x00\x01g\x00\x00\x00\x01\x00\x01m")


def test_a_forwarded_frame_goes_under_the_connection_id_and_comes_back_under_its_own() -> None:
    client, broker = ClientConnection("kipside"), FakeBroker()
    for original in (41, 7):
        broker.receive(
            [client.send_frame(heartbeat_frame(original), ApiKey.HEARTBEAT, 0, tag=original)]
        )
    assert [h.correlation_id for h, _ in broker.requests] == [0, 1]  # the connection's own
    client.receive_data(broker.answer(0, b"\x00\x00") + broker.answer(1, b"\x00\x00"))
    answers = drain(client)
    assert [(r.correlation_id, r.tag) for r in answers] == [(41, 41), (7, 7)]
    assert [response_correlation_id(r.frame) for r in answers] == [41, 7]


def test_kept_ids_are_not_rewritten() -> None:
    client, broker = ClientConnection("kipside", keep_correlation_ids=True), FakeBroker()
    frame = heartbeat_frame(41)
    sent = client.send_frame(frame, ApiKey.HEARTBEAT, 0)
    assert sent is frame
    broker.receive([sent])
    client.receive_data(broker.answer(0, b"\x00\x00"))
    assert [r.correlation_id for r in drain(client)] == [41]


def test_own_requests_beside_kept_ids_count_down_from_the_highest_id() -> None:
    # A client's acks=0 request (id 0, which Tansu answers anyway), then a request of the
    # connection's own: their ids must not collide, or the dropped answer would be taken as
    # the own request's.
    client, broker = ClientConnection("kipside", keep_correlation_ids=True), FakeBroker()
    broker.receive(
        [client.send_frame(heartbeat_frame(0), ApiKey.PRODUCE, 9, expects_response=False)]
    )
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b"", tag="barrier"))
    broker.receive(client.send_request(ApiKey.API_VERSIONS, 0, b"", tag="next"))
    assert [h.correlation_id for h, _ in broker.requests] == [0, 2**31 - 1, 2**31 - 2]
    client.receive_data(broker.answer(0, b"") + broker.answer(1, b"\x00\x00"))
    assert [(r.correlation_id, r.tag) for r in drain(client)] == [(2**31 - 1, "barrier")]


def test_an_answer_to_an_acks0_request_is_dropped() -> None:
    client, broker = ClientConnection("kipside"), FakeBroker()
    broker.receive(
        [client.send_frame(heartbeat_frame(1), ApiKey.PRODUCE, 9, expects_response=False)]
    )
    broker.receive([client.send_frame(heartbeat_frame(2), ApiKey.HEARTBEAT, 0)])
    assert client.waiting == 1
    client.receive_data(broker.answer(0, b"") + broker.answer(1, b"\x00\x00"))  # Tansu answers
    assert [r.correlation_id for r in drain(client)] == [2]


def test_a_raw_token_is_answered_by_the_next_frame() -> None:
    client = ClientConnection("kipside")
    token = b"\x00\x00\x00\x03abc"
    assert client.send_raw(token, tag="t") == token
    client.receive_data(b"\x00\x00\x00\x00")  # PLAIN's answer: an empty frame
    [answer] = drain(client)
    assert (answer.tag, answer.frame) == ("t", b"\x00\x00\x00\x00")


def test_the_oldest_request_is_overdue_after_its_timeout_or_its_allowance() -> None:
    client, broker = ClientConnection("kipside", answer_timeout=5.0), FakeBroker()
    assert client.deadline() == float("inf")
    broker.receive([client.send_frame(heartbeat_frame(1), ApiKey.HEARTBEAT, 0, now=10.0)])
    broker.receive(
        [client.send_frame(heartbeat_frame(2), ApiKey.FETCH, 11, now=11.0, allowance=30.0)]
    )
    assert client.deadline() == 15.0 and client.overdue(14.9) is None
    client.receive_data(broker.answer(0, b"\x00\x00"), now=14.0)  # the Fetch is the oldest now
    assert client.deadline() == 14.0 + 30.0  # from when it became the oldest, its allowance
    late = client.overdue(44.0)
    assert late is not None and late.api_key == ApiKey.FETCH
    assert [t for t in client.close()] == [None]
    assert client.deadline() == float("inf")
