"""MarkerWindowRelay itself (tests/txn_relay.py, the SIMULATION of Apache Kafka's marker window
the transaction tests run on), in front of Tansu over a raw socket, no kipside: response order
on a connection, header versions, correlation ids, the unknown-topic refusal and the optional
delay.

Run: .venv/bin/pytest tests/integration/test_transactions_relay.py -q -s -p no:cacheprovider
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import struct
import time
import typing
from typing import Any

import pytest
from conftest import create_topics, unique_name
from kio.static.primitive import i16, i32, i64
from relaykit.tansu import tansu_behind
from txn_relay import CONCURRENT_TRANSACTIONS, MarkerWindowRelay

from kipside.protocol.apis import ApiKey
from kipside.protocol.headers import (
    build_frame,
    encode_request_header,
    parse_response_header,
    response_correlation_id,
)
from kipside.protocol.messages import decode_response, encode_message, request_class

from .raw_batches import read_frame

pytestmark = pytest.mark.integration

Wanted = dict[str, list[int]]  # topic -> partitions of an AddPartitionsToTxn


def _request(api_key: int, version: int, correlation_id: int, message: Any) -> bytes:
    header = encode_request_header(api_key, version, correlation_id, "kipside-it-relay")
    return build_frame(header, encode_message(message))


def _add_partitions_request(version: int, txn_id: str, topics: Wanted) -> Any:
    cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, version)
    topic_cls = typing.get_args(typing.get_type_hints(cls)["v3_and_below_topics"])[0]
    return cls(
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=i64(1),
        v3_and_below_producer_epoch=i16(0),
        v3_and_below_topics=tuple(
            topic_cls(name=name, partitions=tuple(i32(p) for p in ps))
            for name, ps in topics.items()
        ),
    )


def _add_partitions(version: int, correlation_id: int, txn_id: str, topics: Wanted) -> bytes:
    """An AddPartitionsToTxn request frame."""
    message = _add_partitions_request(version, txn_id, topics)
    return _request(ApiKey.ADD_PARTITIONS_TO_TXN, version, correlation_id, message)


def _partition_codes(frame: bytes, version: int) -> list[tuple[str, int, int]]:
    header = parse_response_header(frame, ApiKey.ADD_PARTITIONS_TO_TXN, version)
    response = decode_response(ApiKey.ADD_PARTITIONS_TO_TXN, version, frame, header.body_offset)
    return [
        (str(t.name), int(p.partition_index), int(p.partition_error_code))
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    ]


def _parked_fetch(topic: str, correlation_id: int) -> bytes:
    """A Fetch v4 the broker parks (empty partition, min_bytes 1, max_wait 400 ms)."""
    name = topic.encode()
    fetch = struct.pack(">iiiib", -1, 400, 1, 1 << 20, 0) + struct.pack(">ih", 1, len(name))
    fetch += name + struct.pack(">iiqi", 1, 0, 0, 1 << 20)
    header = encode_request_header(ApiKey.FETCH, 4, correlation_id, "kipside-it-relay")
    return build_frame(header, fetch)


def _window_answers_wait_behind_the_broker(
    sock: socket.socket, txn_id: str, wanted: Wanted
) -> float:
    """A parked Fetch, then three requests the relay answers itself, written together: the
    answers come in request order, with the requests' correlation ids and header versions,
    each AddPartitionsToTxn rejection listing exactly the requested partitions. Returns how
    long the Fetch took."""
    offsets_cls = request_class(ApiKey.ADD_OFFSETS_TO_TXN, 0)
    add_offsets = offsets_cls(
        transactional_id=txn_id, producer_id=i64(1), producer_epoch=i16(0), group_id="g"
    )
    topic = next(iter(wanted))
    sent = time.monotonic()
    sock.sendall(
        _parked_fetch(topic, 100)
        + _add_partitions(0, 101, txn_id, wanted)
        + _add_partitions(3, -7, txn_id, wanted)
        + _request(ApiKey.ADD_OFFSETS_TO_TXN, 0, 103, add_offsets)
    )
    frames = [read_frame(sock) for _ in range(4)]
    fetch_seconds = time.monotonic() - sent
    assert [response_correlation_id(f) for f in frames] == [100, 101, -7, 103]
    want = [(t, p, CONCURRENT_TRANSACTIONS) for t, ps in wanted.items() for p in ps]
    assert _partition_codes(frames[1], 0) == want
    assert _partition_codes(frames[2], 3) == want  # response header v1 for v3
    offsets_header = parse_response_header(frames[3], ApiKey.ADD_OFFSETS_TO_TXN, 0)
    answer = decode_response(ApiKey.ADD_OFFSETS_TO_TXN, 0, frames[3], offsets_header.body_offset)
    assert int(answer.error_code) == CONCURRENT_TRANSACTIONS
    return fetch_seconds


def _outside_the_window(
    sock: socket.socket, relay: MarkerWindowRelay, other_id: str, wanted: Wanted
) -> None:
    """Outside any window: unknown topics refused by the relay, the rest forwarded."""
    topic = next(iter(wanted))
    relay.unknown_topics = frozenset({"other"})
    sock.sendall(_add_partitions(3, 104, other_id, wanted))
    refused = _partition_codes(read_frame(sock), 3)
    assert refused == [(topic, p, 55) for p in wanted[topic]] + [("other", 7, 3)]
    relay.unknown_topics = frozenset()
    sock.sendall(_add_partitions(3, 105, other_id, {topic: [0]}))
    forwarded = read_frame(sock)
    assert response_correlation_id(forwarded) == 105
    _partition_codes(forwarded, 3)  # the broker's answer decodes


def _delayed_round_trips(
    sock: socket.socket, relay: MarkerWindowRelay, other_id: str, topic: str
) -> list[float]:
    """delay_ms: each direction is delayed, local answers included (a simulated RTT)."""
    relay.delay_ms = 30.0
    relay.open_window(other_id, 5000)
    round_trips = []
    for correlation_id, frame in (
        (106, build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 106, None), b"")),
        (107, _add_partitions(3, 107, other_id, {topic: [0]})),
    ):
        sent = time.monotonic()
        sock.sendall(frame)
        assert response_correlation_id(read_frame(sock)) == correlation_id
        round_trips.append(time.monotonic() - sent)
    assert min(round_trips) >= 0.055, round_trips
    relay.delay_ms = 0.0
    return round_trips


def test_relay_answers_in_order_with_right_headers(request: pytest.FixtureRequest) -> None:
    """MarkerWindowRelay, on its own in front of Tansu (raw socket, no kipside): a local answer
    waits behind a response the broker still owes on the same connection; AddPartitionsToTxn
    v0 and v3 (flexible) rejections list exactly the requested partitions with error 51 under
    the request's correlation id and header version; AddOffsetsToTxn gets 51; outside the
    window requests are forwarded; unknown_topics are refused the Apache Kafka way."""
    relay = MarkerWindowRelay(window_ms=50)
    with tansu_behind(relay):
        topic = unique_name("relay", request)
        create_topics(relay.bootstrap, [topic], 3)
        txn_id = unique_name("relay-self")
        relay.open_window(txn_id, 5000)
        wanted = {topic: [2, 0, 1], "other": [7]}
        other_id = unique_name("relay-other")
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
            fetch_seconds = _window_answers_wait_behind_the_broker(sock, txn_id, wanted)
            _outside_the_window(sock, relay, other_id, wanted)
            round_trips = _delayed_round_trips(sock, relay, other_id, topic)
        counts = relay.counts()
        assert (
            counts.rejected_add_partitions,
            counts.rejected_add_offsets,
            counts.refused_add_partitions,
            counts.accepted_add_partitions,
        ) == (3, 1, 1, 1)
        assert counts.forwarded[ApiKey.FETCH] == 1 and counts.local_answers == 5
        assert not relay.problems(), relay.problems()
        print(
            f"\n[relay] parked Fetch answered after {fetch_seconds:.3f} s, local answers after "
            f"it; round trips with delay_ms=30: {[round(t, 3) for t in round_trips]}"
        )


def _exchange(sock: socket.socket, api_key: int, version: int, message: Any) -> Any:
    sock.sendall(_request(api_key, version, 200, message))
    frame = read_frame(sock)
    return decode_response(
        api_key, version, frame, parse_response_header(frame, api_key, version).body_offset
    )


def _offered(sock: socket.socket) -> dict[int, tuple[int, int]]:
    answer = _exchange(sock, ApiKey.API_VERSIONS, 0, request_class(ApiKey.API_VERSIONS, 0)())
    return {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in answer.api_keys}


def _describe(sock: socket.socket, txn_id: str) -> tuple[str, list[tuple[str, int]]]:
    cls = request_class(ApiKey.DESCRIBE_TRANSACTIONS, 0)
    answer = _exchange(sock, ApiKey.DESCRIBE_TRANSACTIONS, 0, cls(transactional_ids=(txn_id,)))
    (state,) = answer.transaction_states
    assert int(state.error_code) == 0, state
    partitions = [(str(t.topic), int(p)) for t in state.topics for p in t.partitions]
    return str(state.transaction_state), partitions


@pytest.mark.parametrize("kafka", [False, True], ids=["tansu", "kafka-3.0+"])
def test_the_relay_offers_what_its_coordinator_would(
    kafka: bool, request: pytest.FixtureRequest
) -> None:
    """Modelling Tansu, the relay offers what Tansu offers (no DescribeTransactions); modelling
    Apache Kafka 3.0+, it offers DescribeTransactions v0 and answers it from what it saw: Empty
    after InitProducerId (asked in v0, which the relay answers as Apache Kafka does), Ongoing
    with the added partitions, PrepareCommit with fewer and fewer partitions lacking markers
    during the window, then CompleteCommit."""
    relay = MarkerWindowRelay(window_ms=300, describe_transactions=kafka, init_producer_id_v0=True)
    with tansu_behind(relay):
        topic = unique_name("relay-describe", request)
        create_topics(relay.bootstrap, [topic], 4)
        txn_id = unique_name("relay-describe")
        lacking: list[int] = []
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as sock:
            offered = _offered(sock)
            assert (offered.get(ApiKey.DESCRIBE_TRANSACTIONS) == (0, 0)) is kafka
            init = request_class(ApiKey.INIT_PRODUCER_ID, 0)(
                transactional_id=txn_id, transaction_timeout=datetime.timedelta(seconds=60)
            )
            producer = _exchange(sock, ApiKey.INIT_PRODUCER_ID, 0, init)
            assert int(producer.error_code) == 0 and int(producer.producer_id) >= 0
            if not kafka:
                return
            assert _describe(sock, txn_id) == ("Empty", [])
            add = _add_partitions_request(0, txn_id, {topic: [0, 1, 2, 3]})
            add = dataclasses.replace(
                add,
                v3_and_below_producer_id=producer.producer_id,
                v3_and_below_producer_epoch=producer.producer_epoch,
            )
            assert {c for *_, c in _partition_codes_of(sock, add)} == {0}
            state, partitions = _describe(sock, txn_id)
            assert (state, sorted(partitions)) == ("Ongoing", [(topic, p) for p in range(4)])
            end = request_class(ApiKey.END_TXN, 0)(
                transactional_id=txn_id,
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch,
                committed=True,
            )
            assert int(_exchange(sock, ApiKey.END_TXN, 0, end).error_code) == 0
            while (described := _describe(sock, txn_id))[0] == "PrepareCommit":
                lacking.append(len(described[1]))
                time.sleep(0.05)
            assert described == ("CompleteCommit", [])
            assert lacking[0] == 4 and lacking == sorted(lacking, reverse=True), lacking
    assert not relay.problems(), relay.problems()
    assert relay.counts().described == (len(lacking) + 3 if kafka else 0)


def _partition_codes_of(sock: socket.socket, add: Any) -> list[tuple[str, int, int]]:
    sock.sendall(_request(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 201, add))
    return _partition_codes(read_frame(sock), 0)
