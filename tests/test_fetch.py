"""Tests for protocol.fetch's responses: the hand-written Fetch v4-v12 reader against kio, an
independent codec. Responses are encoded by kio and read here. Any byte string that is not a
valid response must raise DecodeError and nothing else. Requests are tested in
test_fetch_request.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from batches import data_batch
from fetch_kit import VERSIONS, int32, int64, names
from hypothesis import given, settings
from hypothesis import strategies as st

from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import DecodeError
from kipside.protocol.fetch import (
    AbortedTransaction,
    FetchPartition,
    FetchResponseData,
    encode_fetch_request,
    fetch_request_max_bytes,
    parse_fetch_response,
    replace_fetch_records,
)
from kipside.protocol.headers import build_frame, encode_response_header, parse_response_header
from kipside.protocol.messages import build, encode_message, response_class
from kipside.protocol.primitives import INT32, write_uvarint
from kipside.protocol.records import iter_batches

FLEXIBLE = 12  # the first flexible Fetch version


# ---- responses built by kio ---------------------------------------------------------------


def partition(
    index: int = 0,
    *,
    aborted: list[tuple[int, int]] | None = None,
    records: bytes | None = b"",
    leader: tuple[int, int] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition_index": index,
        "error_code": 0,
        "high_watermark": 10,
        "last_stable_offset": 8,
        "log_start_offset": 2,
        "preferred_read_replica": 3,
        "aborted_transactions": (
            None if aborted is None else [{"producer_id": p, "first_offset": o} for p, o in aborted]
        ),
        "records": records,
        **fields,
    }
    if leader is not None:
        out["current_leader"] = {"leader_id": leader[0], "leader_epoch": leader[1]}
    return out


def response_body(
    version: int, topics: list[tuple[str, list[dict[str, Any]]]], **top: Any
) -> bytes:
    fields = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        **top,
        "responses": [{"topic": t, "partitions": ps} for t, ps in topics],
    }
    return encode_message(build(response_class(ApiKey.FETCH, version), fields))


def response_frame(version: int, body: bytes, correlation_id: int = 9) -> tuple[bytes, int]:
    frame = build_frame(encode_response_header(ApiKey.FETCH, version, correlation_id), body)
    return frame, parse_response_header(frame, ApiKey.FETCH, version).body_offset


def parse(version: int, body: bytes) -> FetchResponseData:
    return parse_fetch_response(body, 0, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_response_fields(version: int) -> None:
    records = data_batch(base_offset=5) + data_batch(base_offset=6, values=(b"a", b"b"))
    body = response_body(
        version,
        [
            ("orders", [partition(0, aborted=[(77, 5), (78, 9)], records=records)]),
            ("tópico", [partition(1, error_code=6, high_watermark=-1), partition(4)]),
        ],
        throttle_time=25,
        error_code=0,
        session_id=1234,
    )
    frame, body_offset = response_frame(version, body)
    data = parse_fetch_response(frame, body_offset, version)

    assert data.throttle_time_ms == 25
    assert data.error_code == 0
    assert [(p.topic, p.partition) for p in data.partitions] == [
        ("orders", 0),
        ("tópico", 1),
        ("tópico", 4),
    ]
    first, second, third = data.partitions
    assert (first.error_code, first.high_watermark, first.last_stable_offset) == (0, 10, 8)
    assert first.log_start_offset == (2 if version >= 5 else -1)  # absent before v5
    assert first.aborted_transactions == (AbortedTransaction(77, 5), AbortedTransaction(78, 9))
    assert bytes(first.records) == records
    assert [b.base_offset for b in iter_batches(first.records)] == [5, 6]
    assert (second.error_code, second.high_watermark) == (6, -1)
    assert second.aborted_transactions is None
    assert len(second.records) == len(third.records) == 0
    assert all(p.current_leader is None for p in data.partitions)


@pytest.mark.parametrize("version", [7, 11, 12])
def test_response_top_level_error(version: int) -> None:
    data = parse(version, response_body(version, [], error_code=71))  # INVALID_FETCH_SESSION_EPOCH
    assert (data.error_code, data.partitions) == (71, ())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("aborted", "expected"),
    [(None, None), ([], ()), ([(1, 0)], (AbortedTransaction(1, 0),))],
    ids=["null", "empty", "one"],
)
def test_aborted_transactions_null_or_list(
    version: int, aborted: list[tuple[int, int]] | None, expected: object
) -> None:
    body = response_body(version, [("t", [partition(aborted=aborted)])])
    assert parse(version, body).partitions[0].aborted_transactions == expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("records", [None, b"", b"\xab\xcd\xef", bytes(range(256)) * 40])
def test_records_are_views_of_the_frame(version: int, records: bytes | None) -> None:
    body = response_body(version, [("t", [partition(records=records), partition(1)])])
    frame, body_offset = response_frame(version, body)
    for buffer in (frame, bytearray(frame), memoryview(frame)):
        got = parse_fetch_response(buffer, body_offset, version).partitions[0].records
        assert isinstance(got, memoryview)
        assert bytes(got) == (records or b"")
        assert got.obj is (buffer.obj if isinstance(buffer, memoryview) else buffer)
    if records:
        # A view, not a copy: a change to the frame shows through it.
        mutable = bytearray(frame)
        view = parse_fetch_response(mutable, body_offset, version).partitions[0].records
        mutable[frame.index(records) + len(records) - 1] ^= 0xFF
        assert bytes(view) != records


def test_current_leader_tag() -> None:
    body = response_body(
        FLEXIBLE,
        [
            (
                "t",
                [
                    partition(0, leader=(4, 17)),
                    partition(1),
                    # Tags 0 and 2 are known to Kafka but not read here: skipped by size.
                    partition(
                        2,
                        leader=(5, 2),
                        diverging_epoch={"epoch": 3, "end_offset": 99},
                        snapshot_id={"end_offset": 50, "epoch": 1},
                        records=b"xyz",
                    ),
                ],
            )
        ],
    )
    got = parse(FLEXIBLE, body).partitions
    assert [p.current_leader for p in got] == [(4, 17), None, (5, 2)]
    assert bytes(got[2].records) == b"xyz"


def test_unknown_tags_are_skipped() -> None:
    body = response_body(FLEXIBLE, [("t", [partition(records=b"abc")])])
    assert body[-1:] == b"\x00"  # the top-level tag section is last and empty
    tagged = body[:-1] + bytes.fromhex("020702abcd810100")  # tags 7 and 129
    assert bytes(parse(FLEXIBLE, tagged).partitions[0].records) == b"abc"


# ---- responses that lie -------------------------------------------------------------------


def valid_bodies() -> list[tuple[int, bytes]]:
    return [
        (
            v,
            response_body(
                v,
                [("t", [partition(0, aborted=[(3, 1)], records=data_batch(base_offset=1))])],
                throttle_time=1,
            ),
        )
        for v in VERSIONS
    ]


@pytest.mark.parametrize(("version", "body"), valid_bodies(), ids=[f"v{v}" for v in VERSIONS])
def test_every_truncation_is_a_decode_error(version: int, body: bytes) -> None:
    for cut in range(len(body)):
        with pytest.raises(DecodeError):
            parse(version, body[:cut])
    with pytest.raises(DecodeError, match="1 trailing bytes"):
        parse(version, body + b"\x00")


def v4_body(*, topics: bytes, partitions: bytes, aborted: bytes, records: bytes) -> bytes:
    """A v4 response with one topic "t" and one partition, counts and sizes given raw."""
    return (
        INT32.pack(0)  # throttle
        + topics
        + b"\x00\x01t"
        + partitions
        + INT32.pack(0)  # partition index
        + b"\x00\x00"  # error code
        + (10).to_bytes(8, "big")  # high watermark
        + (10).to_bytes(8, "big")  # last stable offset
        + aborted
        + records
    )


ONE = INT32.pack(1)
NO_ABORTED = INT32.pack(-1)
NO_RECORDS = INT32.pack(-1)


def test_hand_written_v4_body_is_valid() -> None:
    body = v4_body(topics=ONE, partitions=ONE, aborted=NO_ABORTED, records=NO_RECORDS)
    assert parse(4, body).partitions[0].aborted_transactions is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topics": INT32.pack(2**31 - 1)}, r"claims 2147483647 topics"),
        ({"topics": INT32.pack(-1)}, r"topics as a null array"),
        ({"topics": INT32.pack(-(2**31))}, r"topics as a null array"),
        ({"partitions": INT32.pack(2**31 - 1)}, r"claims 2147483647 partitions of t"),
        ({"partitions": INT32.pack(-1)}, r"partitions of t as a null array"),
        ({"aborted": INT32.pack(100_000)}, r"claims 100000 aborted transactions"),
        ({"records": INT32.pack(2**31 - 1)}, r"records of t-0 run past the end"),
        ({"records": INT32.pack(1)}, r"records of t-0 run past the end"),
        ({"records": INT32.pack(0) + b"\x00"}, r"1 trailing bytes"),
    ],
)
def test_lying_lengths(fields: dict[str, bytes], message: str) -> None:
    parts = {"topics": ONE, "partitions": ONE, "aborted": NO_ABORTED, "records": NO_RECORDS}
    body = v4_body(**{**parts, **fields})
    with pytest.raises(DecodeError, match=message):
        parse(4, body)


def test_null_topic_name() -> None:
    body = INT32.pack(0) + ONE + b"\xff\xff" + INT32.pack(0)
    with pytest.raises(DecodeError, match="null topic"):
        parse(4, body)


@pytest.mark.parametrize(
    "tail",
    [
        write_uvarint(2**31),  # a compact array count far beyond the bytes left
        b"\xff\xff\xff\xff\xff\xff",  # an unsigned varint longer than 5 bytes
        b"\x80",  # a varint cut short
    ],
)
def test_flexible_lying_counts(tail: bytes) -> None:
    head = INT32.pack(0) + b"\x00\x00" + INT32.pack(0)  # throttle, error code, session id
    with pytest.raises(DecodeError):
        parse(FLEXIBLE, head + tail)


def test_tagged_field_past_the_end() -> None:
    body = response_body(FLEXIBLE, [])
    with pytest.raises(DecodeError, match="past the end"):
        parse(FLEXIBLE, body[:-1] + b"\x01\x00\x7f\x00")


@pytest.mark.parametrize("version", [3, 13])
def test_response_version_outside_range(version: int) -> None:
    with pytest.raises(DecodeError, match="outside the v4-v12 range"):
        parse(version, response_body(7, []))


def assert_only_decode_error(version: int, body: bytes, offset: int = 0) -> None:
    try:
        data = parse_fetch_response(body, offset, version)
    except DecodeError:
        return
    for p in data.partitions:  # whatever parses must still point inside the frame
        assert p.records.obj is body


@settings(deadline=None, max_examples=500)
@given(version=st.sampled_from(VERSIONS), body=st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(version: int, body: bytes) -> None:
    assert_only_decode_error(version, body)


@settings(deadline=None, max_examples=1000)
@given(base=st.sampled_from(valid_bodies()), data=st.data())
def test_mutated_frames_raise_only_decode_error(
    base: tuple[int, bytes], data: st.DataObject
) -> None:
    version, body = base
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["set", "cut", "insert"]), label="kind")
        at = data.draw(st.integers(0, len(mutated)), label="at")
        if kind == "set" and at < len(mutated):
            mutated[at] = data.draw(st.integers(0, 255), label="byte")
        elif kind == "cut":
            del mutated[at:]
        else:
            mutated[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="inserted")
    assert_only_decode_error(version, bytes(mutated))


# ---- hypothesis round trip through kio ----------------------------------------------------


@st.composite
def partitions_strategy(draw: st.DrawFn, index: int) -> dict[str, Any]:
    aborted = draw(st.none() | st.lists(st.tuples(int64, int64), max_size=3))
    leader = draw(st.none() | st.tuples(int32, int32))
    return partition(
        index,
        aborted=aborted,
        records=draw(st.none() | st.binary(max_size=40)),
        leader=leader,
        error_code=draw(st.sampled_from([0, 1, 3, 6, 74])),
        high_watermark=draw(int64),
        last_stable_offset=draw(int64),
        log_start_offset=draw(int64),
        preferred_read_replica=draw(int32),
    )


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, list[tuple[str, list[dict[str, Any]]]], int]:
    version = draw(st.sampled_from(VERSIONS))
    topic_names = draw(st.lists(names, unique=True, max_size=3))
    topics = [
        (name, [draw(partitions_strategy(i)) for i in range(draw(st.integers(0, 3)))])
        for name in topic_names
    ]
    return version, topics, draw(st.integers(0, 2**31 - 1))


@settings(deadline=None)
@given(case=responses())
def test_response_round_trip(case: tuple[int, list[tuple[str, list[dict[str, Any]]]], int]) -> None:
    version, topics, throttle = case
    frame, body_offset = response_frame(
        version, response_body(version, topics, throttle_time=throttle)
    )
    data = parse_fetch_response(frame, body_offset, version)
    assert data.throttle_time_ms == throttle
    sent = [(name, p) for name, ps in topics for p in ps]
    assert len(data.partitions) == len(sent)
    for got, (name, p) in zip(data.partitions, sent, strict=True):
        assert (got.topic, got.partition, got.error_code) == (
            name,
            p["partition_index"],
            p["error_code"],
        )
        assert (got.high_watermark, got.last_stable_offset) == (
            p["high_watermark"],
            p["last_stable_offset"],
        )
        assert got.log_start_offset == (p["log_start_offset"] if version >= 5 else -1)
        aborted = p["aborted_transactions"]
        assert got.aborted_transactions == (
            None
            if aborted is None
            else tuple(AbortedTransaction(a["producer_id"], a["first_offset"]) for a in aborted)
        )
        assert bytes(got.records) == (p["records"] or b"")
        assert got.records.obj is frame
        leader = p.get("current_leader")
        # kio leaves a tagged field out when it holds the default (-1, -1).
        expected = None
        if (
            version >= FLEXIBLE
            and leader
            and (leader["leader_id"], leader["leader_epoch"]) != (-1, -1)
        ):
            expected = (leader["leader_id"], leader["leader_epoch"])
        assert got.current_leader == expected


# ---- records replaced (the columnar stage's answers) ----------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_replaced_records_are_what_kio_would_have_written(version: int) -> None:
    old = data_batch(base_offset=5)
    new = data_batch(base_offset=5, values=(b"a" * 300, b"b")) * 2  # longer: a wider length
    tagged: dict[str, Any] = {"leader": (4, 17)} if version >= FLEXIBLE else {}
    topics = [
        ("a", [partition(0, aborted=[(7, 5)], records=old), partition(1, records=old)]),
        ("b", [partition(2, records=None), partition(3, records=old, **tagged)]),
    ]
    frame, body_offset = response_frame(version, response_body(version, topics))
    replaced = replace_fetch_records(frame, body_offset, version, {1: new, 3: b""})
    expected = [
        ("a", [partition(0, aborted=[(7, 5)], records=old), partition(1, records=new)]),
        ("b", [partition(2, records=None), partition(3, records=b"", **tagged)]),
    ]
    assert replaced == response_frame(version, response_body(version, expected))[0]
    assert replace_fetch_records(frame, body_offset, version, {}) == frame


@pytest.mark.parametrize("version", VERSIONS)
def test_max_bytes_of_a_request(version: int) -> None:
    fetch = FetchPartition("t", 0, 0, 1 << 20)
    body = encode_fetch_request(
        version, [fetch], max_wait_ms=500, min_bytes=1, max_bytes=52_428_800, isolation_level=1
    )
    assert fetch_request_max_bytes(b"head" + body, 4, version) == 52_428_800
    with pytest.raises(DecodeError):
        fetch_request_max_bytes(body[:14], 0, version)
