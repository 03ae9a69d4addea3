"""The scapy layers for Kafka frames and the robustness kit built on them.

- Every frame of the golden captures dissects (kafka_frames, then KafkaRequest or
  KafkaResponse/KafkaResponseV1) into the header kipside.protocol reads, and builds back into
  the very same bytes.
- A ProduceRequest built with the kit is the one kipside.protocol encodes, byte for byte.
- Each malformed frame of the kit (MALFORMED) is refused by kipside.protocol with a
  ProtocolError, or tolerated the way Apache Kafka tolerates it; nothing else is ever raised.
- A capture carrying the malformed frames is still summarised, each counted where it belongs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from captures import pcapkit
from kipside.evidence import kafka_frames, summarize
from kipside.evidence.craft import MALFORMED, produce_request
from kipside.evidence.layers import KafkaRequest, ProduceRequestBody
from kipside.protocol import (
    ApiKey,
    FrameDecoder,
    PartitionBatch,
    ProtocolError,
    Record,
    RecordBatchError,
    build_frame,
    decode_request,
    encode_batch,
    encode_produce_request,
    encode_request_header,
    iter_batches,
    parse_produce_request,
    parse_request_header,
)

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize(
    "path", sorted(GOLDEN.glob("*/*.pcap")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_every_captured_frame_dissects_and_builds_back(path: Path) -> None:
    frames = list(kafka_frames(path))
    assert frames
    for frame in frames:
        layer = frame.layer()
        assert bytes(layer) == frame.data
        assert layer.correlation_id == frame.correlation_id
        if not frame.is_response:
            header = parse_request_header(frame.data)
            assert (layer.api_key, layer.api_version) == (header.api_key, header.api_version)
            assert layer.client_id.decode() == (header.client_id or "")
    assert {f.is_response for f in frames} == {False, True}


def test_a_produce_request_from_the_kit_is_the_one_protocol_encodes() -> None:
    batch = encode_batch([Record(b"k", b"v")], base_timestamp=1_700_000_000_000)
    kit = produce_request({"t": {0: batch, 1: batch}}, version=7, acks=1, correlation_id=9)
    body = encode_produce_request(
        7,
        acks=1,
        timeout_ms=30000,
        partitions=[PartitionBatch("t", p, memoryview(batch)) for p in (0, 1)],
    )
    header = encode_request_header(ApiKey.PRODUCE, 7, 9, "kit")
    assert bytes(kit) == build_frame(header, b"".join(bytes(c) for c in body))
    dissected = KafkaRequest(bytes(kit))
    assert [p.index for p in dissected[ProduceRequestBody].topics[0].partitions] == [0, 1]


# What kipside.protocol makes of each malformed frame. "tolerated": decoded as Apache Kafka's
# own readers do (a negative length other than -1 reads as null; tagged fields out of order are
# skipped by size).
OUTCOMES = {
    "size-too-small": "refused",
    "size-too-large": "incomplete",
    "size-negative": "refused",
    "truncated-header": "incomplete",
    "truncated-body": "incomplete",
    "unknown-api-key": "refused",
    "tagged-fields-count": "refused",
    "tagged-fields-size": "refused",
    "tagged-fields-order": "tolerated",
    "tagged-fields-varint": "refused",
    "huge-topics-array": "refused",
    "huge-partitions-array": "refused",
    "negative-client-id": "tolerated",
    "negative-transactional-id": "tolerated",
    "negative-topic-name": "refused",
    "negative-records": "tolerated",
}


def protocol_reads(frame: bytes) -> str:
    """Take the frame as kipside.protocol would from a client: framing, header, body."""
    decoder = FrameDecoder()
    decoder.receive_data(frame)
    try:
        whole = decoder.next_frame()
        if whole is None:
            return "incomplete"
        header = parse_request_header(whole)
        if header.api_key == ApiKey.PRODUCE:
            produce = parse_produce_request(whole, header.body_offset, header.api_version)
            for partition in produce.partitions:
                if partition.records is not None:
                    list(iter_batches(partition.records))
        else:
            decode_request(header.api_key, header.api_version, whole, header.body_offset)
    except (ProtocolError, RecordBatchError):
        return "refused"
    return "tolerated"


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_frame_is_refused_or_tolerated_never_a_crash(name: str) -> None:
    assert protocol_reads(MALFORMED[name]) == OUTCOMES[name]


def test_the_kit_names_every_kind_the_outcomes_list() -> None:
    assert set(MALFORMED) == set(OUTCOMES)


def test_a_capture_of_malformed_frames_is_summarised(tmp_path: Path) -> None:
    """Each malformed frame on its own connection, after a good request and before another."""
    good = bytes(KafkaRequest(api_key=ApiKey.API_VERSIONS, api_version=0, correlation_id=1))
    connections = []
    for n, name in enumerate(sorted(MALFORMED)):
        after = bytes(KafkaRequest(api_key=ApiKey.API_VERSIONS, api_version=0, correlation_id=3))
        requests = [(good, None), (MALFORMED[name], None), (after, None)]
        connections += pcapkit.conversation(requests, client=("10.0.0.1", 41000 + n))
    path = pcapkit.write_pcap(tmp_path / "malformed.pcap", pcapkit.from_packets(connections))
    summary = summarize(path, ports=[9092])
    assert sum(summary.connections.values()) == len(MALFORMED)
    # Every good request before a malformed frame is counted, whatever follows it.
    assert summary.api("ApiVersions").requests >= len(MALFORMED)
    assert summary.skipped["unread_requests"] > 0
    assert summary.skipped["frames_bad_sizes"] > 0
    # The truncated Produce took the next request's bytes for its own: its one batch fails
    # its CRC, so that batch's record count (garbage) is not counted.
    assert summary.produce.corrupt_batches == 1
    assert summary.produce.records == 2  # the two intact batches of one record each
