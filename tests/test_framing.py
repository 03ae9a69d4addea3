"""Tests for protocol.framing: size-prefixed frames out of an arbitrarily chunked byte stream."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kipside.protocol.errors import FrameError, LocalProtocolError, NotKafkaError
from kipside.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    encode_frame,
    sniff_foreign_protocol,
    sniff_kafka_request,
)

# The first bytes of a real TLS 1.2/1.3 ClientHello record: content type 22 (handshake),
# record version 3.1, record length 0x0200, handshake type 1 (ClientHello), length 0x0001fc,
# client version 3.3, then the start of the 32-byte random.
TLS_CLIENT_HELLO = bytes.fromhex("16030102000100 01fc0303 5a8b3c1d9e0f".replace(" ", ""))
HTTP_GET = b"GET / HTTP/1.1\r\nHost: localhost:9092\r\n\r\n"


def size_prefix(size: int) -> bytes:
    return struct.pack(">i", size)


def drain(decoder: FrameDecoder) -> list[bytes]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_encode_frame_prefixes_the_size() -> None:
    assert encode_frame(b"abcde") == bytes.fromhex("00000005") + b"abcde"
    assert encode_frame(memoryview(b"")) == bytes.fromhex("00000000")


def test_whole_frame_in_one_chunk() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(b"\x00\x12\x00\x03\x00\x00\x00\x01"))
    assert decoder.next_frame() == bytes.fromhex("00000008 0012 0003 00000001".replace(" ", ""))
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


@given(
    payloads=st.lists(st.binary(min_size=4, max_size=300), max_size=8),
    data=st.data(),
)
def test_frames_survive_any_chunking(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="cuts"))
    bounds = [0, *cuts, len(stream)]
    decoder = FrameDecoder()
    received: list[bytes] = []
    for start, end in itertools.pairwise(bounds):
        decoder.receive_data(stream[start:end])
        received += drain(decoder)
    assert received == [encode_frame(p) for p in payloads]
    assert decoder.buffered == 0


@given(payloads=st.lists(st.binary(min_size=4, max_size=64), min_size=1, max_size=5))
def test_frames_survive_byte_by_byte_delivery(payloads: list[bytes]) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder()
    received: list[bytes] = []
    for i in range(len(stream)):
        decoder.receive_data(memoryview(stream)[i : i + 1])
        received += drain(decoder)
    assert received == [encode_frame(p) for p in payloads]


def test_large_frame_then_small_frames_in_one_chunk() -> None:
    # Over 1 MiB consumed in one buffer: the decoder compacts and must keep its place.
    big = bytes(range(256)) * 5000
    small = [b"after-1", b"after-22"]
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(big) + b"".join(encode_frame(p) for p in small))
    assert drain(decoder) == [encode_frame(big), *(encode_frame(p) for p in small)]
    assert decoder.buffered == 0


def test_truncated_frame_waits_until_complete() -> None:
    frame = encode_frame(b"0123456789")
    decoder = FrameDecoder()
    decoder.receive_data(frame[:2])  # not even the whole size yet
    assert decoder.next_frame() is None
    decoder.receive_data(frame[2:-1])  # everything but the last byte
    assert decoder.next_frame() is None
    assert decoder.next_frame() is None  # asking again changes nothing
    assert decoder.buffered == len(frame) - 1
    decoder.receive_data(frame[-1:])
    assert decoder.next_frame() == frame
    assert decoder.next_frame() is None


def test_negative_size_is_a_frame_error() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(size_prefix(-2) + b"xxxx")
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert not isinstance(info.value, NotKafkaError)
    message = str(info.value)
    assert "-2" in message
    assert "4-byte minimum" in message


def test_size_below_minimum_is_a_frame_error() -> None:
    decoder = FrameDecoder(min_frame_bytes=8)
    decoder.receive_data(size_prefix(5) + b"12345")
    with pytest.raises(FrameError, match=r"frame size 5 .*8-byte minimum"):
        decoder.next_frame()


def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    decoder.receive_data(size_prefix(1001))
    with pytest.raises(FrameError, match=r"frame size 1001 exceeds the 1000-byte cap") as info:
        decoder.next_frame()
    assert not isinstance(info.value, NotKafkaError)


def test_oversized_later_frame_is_a_frame_error_too() -> None:
    decoder = FrameDecoder(max_frame_bytes=64)
    decoder.receive_data(encode_frame(b"fine") + size_prefix(65))
    assert decoder.next_frame() == encode_frame(b"fine")
    with pytest.raises(FrameError, match=r"65 exceeds the 64-byte cap"):
        decoder.next_frame()


def test_frame_exactly_at_the_cap_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_bytes=16, min_frame_bytes=16)
    frame = encode_frame(b"x" * 16)
    decoder.receive_data(frame)
    assert decoder.next_frame() == frame


def test_cap_below_minimum_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        FrameDecoder(max_frame_bytes=3, min_frame_bytes=4)


# (what arrived, how many of its bytes, the protocol the error names)
NOT_KAFKA = [
    *((TLS_CLIENT_HELLO, arrived, "TLS") for arrived in (3, 4, 5, len(TLS_CLIENT_HELLO))),
    *((HTTP_GET, arrived, "HTTP") for arrived in (4, 5, 16, len(HTTP_GET))),
]


@pytest.mark.parametrize(("data", "arrived", "protocol"), NOT_KAFKA)
def test_tls_or_http_is_not_kafka(data: bytes, arrived: int, protocol: str) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(data[:arrived])
    with pytest.raises(NotKafkaError, match=protocol):
        decoder.next_frame()


def test_http_error_quotes_the_request_line() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(HTTP_GET)
    with pytest.raises(NotKafkaError, match=r"GET / HTTP/1\.1"):
        decoder.next_frame()


@pytest.mark.parametrize(
    ("head", "word", "latest_byte"),
    [(TLS_CLIENT_HELLO, "TLS", 3), (HTTP_GET, "HTTP", 4), (b"POST /x HTTP/1.1\r\n", "HTTP", 4)],
)
def test_foreign_protocol_detected_by_the_fourth_byte(
    head: bytes, word: str, latest_byte: int
) -> None:
    decoder = FrameDecoder()
    for i in range(len(head)):
        decoder.receive_data(head[i : i + 1])
        try:
            assert decoder.next_frame() is None
        except NotKafkaError as exc:
            assert word in str(exc)
            assert i + 1 <= latest_byte
            return
    pytest.fail(f"{head!r} was never recognised as {word}")


def test_sniff_leaves_kafka_alone() -> None:
    # An ApiVersions v3 request frame: 0x00000018 size, then api key 18.
    assert sniff_foreign_protocol(bytes.fromhex("00000018001200030000000100")) is None
    assert sniff_foreign_protocol(b"") is None
    assert sniff_foreign_protocol(b"\x16") is None  # too short to tell
    assert sniff_foreign_protocol(TLS_CLIENT_HELLO) == "a TLS ClientHello"
    assert sniff_foreign_protocol(bytes.fromhex("1503030002")) == "a TLS alert"


def test_sniff_only_on_the_first_frame() -> None:
    # After a valid first frame, bytes that look like HTTP are a size like any other.
    decoder = FrameDecoder(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
    decoder.receive_data(encode_frame(b"kafk") + b"GET ")
    assert decoder.next_frame() == encode_frame(b"kafk")
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert not isinstance(info.value, NotKafkaError)
    assert str(struct.unpack(">i", b"GET ")[0]) in str(info.value)


def test_sniff_kafka_request_names_a_plaintext_request() -> None:
    # What a TLS listener says when a client sends plaintext Kafka instead of a ClientHello.
    api_versions = bytes.fromhex("00000018 0012 0003 00000001 0004".replace(" ", "")) + b"test"
    assert sniff_kafka_request(api_versions) == "an ApiVersions v3 request"
    metadata = bytes.fromhex("00000020 0003 000c 00000002".replace(" ", ""))
    assert sniff_kafka_request(metadata) == "a Metadata v12 request"
    assert sniff_kafka_request(TLS_CLIENT_HELLO) is None
    assert sniff_kafka_request(HTTP_GET) is None
    assert sniff_kafka_request(api_versions[:7]) is None  # too short to tell
    assert sniff_kafka_request(bytes.fromhex("00000018 7fff 0003".replace(" ", ""))) is None


# What a server that is not a plaintext Kafka listener sends back to a Kafka request.
NOT_KAFKA_ANSWERS = [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "an HTTP response", "HTTP"),
    (b"\x15\x03\x03\x00\x02\x02\x46", "a TLS alert", "TLS"),
    (b"\x16\x03\x03\x00\x5a\x02\x00\x00\x56\x03\x03", "a TLS handshake", "TLS"),
    (b"SSH-2.0-OpenSSH_9.2p1\r\n", "an SSH banner", "SSH"),
]


@pytest.mark.parametrize(("answer", "named", "protocol"), NOT_KAFKA_ANSWERS)
def test_a_server_answering_in_another_protocol_is_named(
    answer: bytes, named: str, protocol: str
) -> None:
    decoder = FrameDecoder(from_server=True)
    decoder.receive_data(answer)
    with pytest.raises(NotKafkaError, match=f"received {named}") as info:
        decoder.next_frame()
    assert info.value.protocol == protocol
    assert "where a Kafka response was due" in str(info.value)
    assert "max_frame_bytes" not in str(info.value)


def test_http_response_quotes_the_status_line() -> None:
    decoder = FrameDecoder(from_server=True)
    decoder.receive_data(b"HTTP/1.1 404 Not Found\r\n\r\n")
    with pytest.raises(NotKafkaError, match=r"'HTTP/1\.1 404 Not Found'"):
        decoder.next_frame()


def test_a_server_decoder_passes_kafka_answers() -> None:
    decoder = FrameDecoder(from_server=True)
    decoder.receive_data(encode_frame(b"\x00\x00\x00\x07" + b"\x00" * 6))
    assert decoder.next_frame() == encode_frame(b"\x00\x00\x00\x07" + b"\x00" * 6)
