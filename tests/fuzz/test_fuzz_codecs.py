"""Hostile bytes for kipside's hand-written decoders: only the project's own errors come out.

Framing, request and response headers, ProduceRequest and ProduceResponse (full, counting and
node-endpoint readers), FetchResponse's node-endpoint reader, record batches (views, iteration,
counting, re-stamping, control markers), records (the compiled column kernel), SASL tokens and
the client side of a connection. Each starts from valid bytes that hypothesis corrupts
(fuzz.hostile), or from bytes it makes up; every example must end in a return or in
ProtocolError (DecodeError, FrameError), RecordBatchError or SaslError. Fetch's full reader is
fuzzed in tests/test_fetch.py, the kio messages in test_fuzz_messages.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from hypothesis import given
from hypothesis import strategies as st
from testkit.produce_frames import HEAD, request_frame, response_frame

from fuzz.hostile import corrupted, fuzz
from fuzz.skeletons import encode, skeleton
from kipside.protocol import (
    ApiKey,
    ClientConnection,
    FrameDecoder,
    ProtocolError,
    RecordBatchError,
    SaslError,
    new_client,
    new_server,
    scram_credential,
)
from kipside.protocol.batch_builder import Record, encode_batch
from kipside.protocol.fetch import fetch_response_names_nodes
from kipside.protocol.headers import (
    parse_request_header,
    parse_response_header,
    request_body_offset,
)
from kipside.protocol.messages import response_class
from kipside.protocol.produce import (
    PartitionBatch,
    count_produce_request,
    parse_produce_request,
    parse_produce_response,
    produce_request_acks,
    produce_response_error_codes,
    produce_response_names_nodes,
)
from kipside.protocol.records import (
    RecordBatchView,
    batch_extent,
    control_type,
    count_batches,
    iter_batches,
    restamp,
)

OWN_ERRORS = (ProtocolError, RecordBatchError, SaslError)
FRAME_CAP = 4096
Reader = Callable[[bytes, int, int], object]  # (frame, body offset, version)


@contextlib.contextmanager
def only_own_errors() -> Iterator[None]:
    with contextlib.suppress(*OWN_ERRORS):
        yield


def read_each(frame: bytes, version: int, *readers: Reader) -> None:
    """Each reader on the frame (its body after HEAD): each must return or raise OWN_ERRORS."""
    for read in readers:
        with only_own_errors():
            read(frame, len(HEAD), version)


def step_each(step: Callable[[bytes], object], tokens: list[bytes]) -> None:
    """The tokens to one side of a SASL exchange in turn, until it returns or raises OWN_ERRORS."""
    with only_own_errors():
        for token in tokens:
            step(token)


def hostile_body(frame: bytes, data: st.DataObject) -> bytes:
    """The frame with its body corrupted (fuzz.hostile.corrupted)."""
    return HEAD + data.draw(corrupted(frame[len(HEAD) :]), label="body")


def batch(values: int = 2) -> bytes:
    records = [Record(b"key-%d" % i, b"value-%d" % i, (("h", b"v"),)) for i in range(values)]
    return encode_batch(records, base_timestamp=1_700_000_000_000)


# Framing and headers ------------------------------------------------------------------------


@fuzz(400)
@given(
    size=st.sampled_from([-(2**31), -2, -1, 0, 3, 7, FRAME_CAP + 1, 2**31 - 1]) | st.integers(),
    chunks=st.lists(st.binary(max_size=64), max_size=6),
)
def test_frame_decoder_refuses_bad_sizes(size: int, chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame_bytes=FRAME_CAP, min_frame_bytes=8)
    fed = 0
    with only_own_errors():
        for chunk in [(size % 2**32).to_bytes(4, "big"), *chunks]:
            decoder.receive_data(chunk)
            fed += len(chunk)
            while (frame := decoder.next_frame()) is not None:
                assert 8 + 4 <= len(frame) <= FRAME_CAP + 4
            assert decoder.buffered <= fed


@fuzz(600)
@given(frame=st.binary(max_size=40), api_key=st.sampled_from(list(ApiKey)))
def test_headers_raise_only_decode_error(frame: bytes, api_key: ApiKey) -> None:
    sized = len(frame).to_bytes(4, "big") + frame
    with only_own_errors():
        header = parse_request_header(sized)
        assert header.body_offset <= len(sized)
    with only_own_errors():
        assert request_body_offset(sized) <= len(sized)
    for version in (0, 3, 9, 12):  # header v0 and v1 (flexible) for most APIs
        with only_own_errors():
            assert parse_response_header(sized, api_key, version).body_offset <= len(sized)


# Produce ------------------------------------------------------------------------------------


def produce_requests() -> list[tuple[int, bytes]]:
    partitions = [
        PartitionBatch("orders", 0, memoryview(batch(2))),
        PartitionBatch("orders", 1, None),
        PartitionBatch("payments", 7, memoryview(batch(1))),
    ]
    return [(version, request_frame(version, "txn", partitions)) for version in range(3, 13)]


@fuzz(500)
@given(base=st.sampled_from(produce_requests()), data=st.data())
def test_produce_requests_raise_only_own_errors(
    base: tuple[int, bytes], data: st.DataObject
) -> None:
    version, frame = base
    hostile = hostile_body(frame, data)
    with only_own_errors():
        request = parse_produce_request(hostile, len(HEAD), version)
        for p in request.partitions:  # records stay views inside the frame
            assert p.records is None or p.records.obj is not None
            assert p.records is None or len(p.records) <= len(hostile)
    read_each(hostile, version, count_produce_request, produce_request_acks)


@fuzz(300)
@given(version=st.integers(0, 13), body=st.binary(max_size=12))
def test_produce_acks_reader_raises_only_decode_error(version: int, body: bytes) -> None:
    """What the session reads of every Produce it forwards (whether an answer is owed)."""
    read_each(HEAD + body, version, produce_request_acks)


def test_produce_acks_reader_agrees_with_the_full_reader() -> None:
    for version, frame in produce_requests():
        parsed = parse_produce_request(frame, len(HEAD), version)
        assert produce_request_acks(frame, len(HEAD), version) == parsed.acks == -1


def produce_responses() -> list[tuple[int, bytes]]:
    return [(version, response_frame(version)) for version in range(3, 13)]


@fuzz(500)
@given(base=st.sampled_from(produce_responses()), data=st.data())
def test_produce_responses_raise_only_decode_error(
    base: tuple[int, bytes], data: st.DataObject
) -> None:
    version, frame = base
    readers = (parse_produce_response, produce_response_error_codes, produce_response_names_nodes)
    read_each(hostile_body(frame, data), version, *readers)


def fetch_responses() -> list[tuple[int, bytes]]:
    """Fetch v16-17 answers as kio writes them (every field and tag set), for the reader that
    looks for node endpoints."""
    return [(v, HEAD + encode(skeleton(response_class(ApiKey.FETCH, v)))) for v in (16, 17)]


@fuzz(300)
@given(base=st.sampled_from(fetch_responses()), data=st.data())
def test_fetch_node_endpoint_reader_raises_only_decode_error(
    base: tuple[int, bytes], data: st.DataObject
) -> None:
    version, frame = base
    assert fetch_response_names_nodes(frame, len(HEAD), version) is True
    read_each(hostile_body(frame, data), version, fetch_response_names_nodes)


# Record batches and records -----------------------------------------------------------------


@fuzz(600)
@given(base=st.sampled_from([batch(1), batch(3), batch(1) + batch(2)]), data=st.data())
def test_record_batches_raise_only_record_batch_error(base: bytes, data: st.DataObject) -> None:
    hostile = data.draw(corrupted(base), label="records")
    batch_extent(hostile)
    with only_own_errors():
        count_batches(hostile)
    with only_own_errors():
        list(iter_batches(hostile, allow_partial_tail=True))
    with only_own_errors():
        for view in iter_batches(hostile):
            restamp(view, 1, 0, 0) if not view.is_control else control_type(view)


@fuzz(200)
@given(base=st.sampled_from([batch(1), batch(3)]), data=st.data())
def test_records_kernel_raises_only_record_batch_error(base: bytes, data: st.DataObject) -> None:
    from kipside.protocol import decode_batch_records  # loads numba

    header, records = base[:61], base[61:]
    hostile = header + data.draw(corrupted(records), label="records")
    # The header's batchLength follows the records, so the view spans what was drawn.
    hostile = hostile[:8] + (len(hostile) - 12).to_bytes(4, "big") + hostile[12:]
    with only_own_errors():
        view = RecordBatchView.from_buffer(hostile)
        decode_batch_records(view)


# SASL and the client side of a connection ---------------------------------------------------


CREDENTIAL = scram_credential("SCRAM-SHA-256", "secret", salt=b"salt", iterations=4096)


@fuzz(300)
@given(
    mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256"]),
    tokens=st.lists(st.binary(max_size=80), min_size=1, max_size=3),
)
def test_sasl_servers_raise_only_sasl_error(mechanism: str, tokens: list[bytes]) -> None:
    server = new_server(mechanism, lambda user, m: CREDENTIAL if m == "SCRAM-SHA-256" else None)
    step_each(server.step, tokens)


@fuzz(200)
@given(tokens=st.lists(st.binary(max_size=80), min_size=1, max_size=2))
def test_scram_client_raises_only_sasl_error(tokens: list[bytes]) -> None:
    client = new_client("SCRAM-SHA-256", "alice", "secret")
    client.first()
    step_each(client.step, tokens)


@fuzz(300)
@given(chunks=st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_client_connection_raises_only_protocol_error(chunks: list[bytes]) -> None:
    connection = ClientConnection("fuzz", max_frame_bytes=FRAME_CAP)
    connection.send_request(ApiKey.METADATA, 12, b"\x01\x00\x00")
    with only_own_errors():
        for chunk in chunks:
            connection.receive_data(chunk)
            while (response := connection.next_response()) is not None:
                assert response.body_offset <= len(response.frame)
