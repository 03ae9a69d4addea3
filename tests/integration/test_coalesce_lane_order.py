"""A cut lane lets no later idempotent batch overtake: a hand-driven idempotent
producer -> kipside -> CountingRelay -> Tansu.

- test_lane_cut_closes_the_client_so_no_later_idempotent_batch_overtakes: a hand-driven
  idempotent producer with sequence 0 in flight and 1 queued when the lane dies, and 2 written
  just after: kipside closes the connection without forwarding 1 or 2, and after reconnecting
  the broker sees 0, 1, 2 once each, in order.

The stack and the log checks are coalesce_kit's.

Run: .venv/bin/pytest tests/integration/test_coalesce_lane_order.py -q -p no:cacheprovider
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import time

import pytest
from conftest import create_topics, unique_name
from relays import BatchSeen

from kipside.protocol.apis import ApiKey
from kipside.protocol.framing import FrameDecoder

from . import coalesce_kit as kit
from . import coalesce_producers as producers

pytestmark = pytest.mark.integration


stack = kit.stack_fixture("stack", kafka_acks0=True)


# --------------------------------------------------------------------------- one raw producer


class RawIdempotentProducer:
    """A hand-driven idempotent producer on one kipside connection: exact control over which
    request is written when, which real clients do not give."""

    def __init__(self, address: tuple[str, int], topic: str) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=10)
        self.topic = topic
        self.decoder = FrameDecoder()
        self.correlation_id = 0
        self.producer_id = -1
        self.epoch = -1

    def close(self) -> None:
        self.sock.close()

    def reconnect(self) -> None:
        """A new connection, same producer id and epoch (what a client does after a disconnect)."""
        self.sock.close()
        self.sock = socket.create_connection(self.address, timeout=10)
        self.decoder = FrameDecoder()

    def wait_closed(self, timeout: float) -> str:
        """Read until the peer closes the connection; fail if anything is answered instead."""
        self.sock.settimeout(timeout)
        try:
            while data := self.sock.recv(65536):
                self.decoder.receive_data(data)
                frame = self.decoder.next_frame()
                assert frame is None, f"answered instead of closed: {bytes(frame[:16])!r}"
        except ConnectionResetError:
            return "reset"
        finally:
            self.sock.settimeout(10)
        return "closed"

    def send(self, api_key: int, version: int, body: bytes) -> int:
        from kipside.protocol.headers import build_frame, encode_request_header

        self.correlation_id += 1
        header = encode_request_header(api_key, version, self.correlation_id, "raw-idempotent")
        self.sock.sendall(build_frame(header, body))
        return self.correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> bytes:
        from kipside.protocol.headers import parse_response_header

        while (frame := self.decoder.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "kipside closed the connection"
            self.decoder.receive_data(data)
        header = parse_response_header(frame, api_key, version)
        assert header.correlation_id == correlation_id, (header, correlation_id)
        return frame[header.body_offset :]

    def init_producer_id(self) -> None:
        # v4 (Tansu answers v0/v1 with UNKNOWN_SERVER_ERROR): null transactional id, timeout,
        # no current producer id/epoch, no tagged fields.
        body = b"\x00" + struct.pack(">iqh", 60000, -1, -1) + b"\x00"
        correlation_id = self.send(ApiKey.INIT_PRODUCER_ID, 4, body)
        frame = self.receive(ApiKey.INIT_PRODUCER_ID, 4, correlation_id)
        _throttle, error, self.producer_id, self.epoch = struct.unpack_from(">ihqh", frame)
        assert error == 0, f"InitProducerId failed with {error}"

    def produce(self, sequence: int) -> int:
        """Write a one-record batch with this base sequence, acks=all; return the correlation id."""
        from kafka.record.default_records import DefaultRecordBatchBuilder

        from kipside.protocol.produce import PartitionBatch, encode_produce_request

        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            batch_size=1 << 20,
        )
        builder.append(
            0,
            timestamp=int(time.time() * 1000),
            key=None,
            value=producers.message_value("raw", sequence),
            headers=[],
        )
        batch = PartitionBatch(self.topic, 0, memoryview(bytes(builder.build())))
        chunks = encode_produce_request(9, acks=-1, timeout_ms=10000, partitions=[batch])
        return self.send(ApiKey.PRODUCE, 9, b"".join(bytes(c) for c in chunks))

    def produce_result(self, correlation_id: int) -> int:
        from kipside.protocol.produce import parse_produce_response

        body = self.receive(ApiKey.PRODUCE, 9, correlation_id)
        header_size = 8  # parse_produce_response reads from a frame: put the prefix back
        response = parse_produce_response(b"\x00" * header_size + body, header_size, 9)
        (result,) = response.partitions
        return result.error_code


def _client_produce_requests(stack: kit.Stack) -> float:
    return stack.metrics().value("kipside_client_requests_total", 0.0, api="Produce")


def _cut_the_lane_under_sequences(
    stack: kit.Stack, producer: RawIdempotentProducer
) -> tuple[int, str]:
    """Sequence 0 held in flight on the lane, 1 queued behind it (kipside has read it), the
    lane cut, then 2 written, before the client can know; wait until kipside closes the client
    connection. Returns the mark of kipside's log before the cut and how the connection ended."""
    relay = stack.relay
    produce_requests = _client_produce_requests(stack)
    relay.hold()
    producer.produce(0)
    kit.wait_until(lambda: relay.counts().held_now >= 1, 10, "sequence 0 held in flight")
    producer.produce(1)  # pipelined: queued on the lane behind 0
    kit.wait_until(
        lambda: _client_produce_requests(stack) >= produce_requests + 2,
        10,
        "kipside to read sequence 1",
    )
    mark = stack.kipside.log_mark()
    relay.cut_all()
    relay.release()
    lane_lines = stack.kipside.wait_for_log(kit.LANE_FAILED_LINE.search, mark, timeout=10)
    assert lane_lines, f"no lane failure logged:\n{stack.kipside.log()[-3000:]}"
    with contextlib.suppress(OSError):  # kipside may have closed the socket already
        producer.produce(2)  # written after kipside failed the lane
    return mark, producer.wait_closed(timeout=10)


def _assert_closed_for_the_lane(stack: kit.Stack, mark: int, how: str) -> list[re.Match[str]]:
    """kipside failed one lane with 2 batches unanswered (0 in flight, 1 queued) and closed
    the one client connection, by name; returns the lane failure lines."""
    log = stack.kipside.log_since(mark).splitlines()
    lanes = [m for ln in log if (m := kit.LANE_FAILED_LINE.search(ln))]
    assert [(int(m.group(4)), int(m.group(5))) for m in lanes] == [(2, 1)], lanes
    closed = [m for ln in log if (m := kit.CLIENT_CLOSED_LINE.search(ln))]
    assert [(m.group(2), m.group(4)) for m in closed] == [("raw-idempotent", "111")], closed
    assert how in ("closed", "reset"), how
    return lanes


def test_lane_cut_closes_the_client_so_no_later_idempotent_batch_overtakes(
    stack: kit.Stack, request: pytest.FixtureRequest
) -> None:
    """Sequence 0 is in flight on a lane when the lane dies, sequence 1 is queued behind it
    (pipelined), and the client writes sequence 2 just after the failure, before it can know.
    A broker connection that dies takes all three with it, so the client resends 0, 1, 2 in
    order on a new connection. Through kipside likewise: kipside closes the client connection,
    so neither 1 nor 2 reaches the broker ahead of 0's resend. (Answering the failed batches
    with an error instead let sequence 2 overtake: the broker saw [1, 0, 1] or [2, 0, ...],
    answered OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumped its epoch.)"""
    topic = unique_name("gap", request)
    create_topics(stack.kipside.bootstrap, [topic], 1)
    relay = stack.relay
    producer = RawIdempotentProducer(("127.0.0.1", stack.kipside.node_ports[111]), topic)
    try:
        producer.init_producer_id()
        mark, how = _cut_the_lane_under_sequences(stack, producer)
        # Nothing of this producer reached the broker since the cut: 0 died held in the relay,
        # 1 and 2 never left kipside.
        before_resend = [b for b in relay.batches() if b.producer_id == producer.producer_id]
        # What the client then does: reconnect and resend, in order, under the same sequences.
        producer.reconnect()
        resent = [producer.produce(sequence) for sequence in (0, 1, 2)]
        results = [producer.produce_result(correlation_id) for correlation_id in resent]
    finally:
        producer.close()
    lanes = _assert_closed_for_the_lane(stack, mark, how)
    assert before_resend == [], before_resend
    assert results == [0, 0, 0], results
    ours: list[BatchSeen] = [b for b in relay.batches() if b.producer_id == producer.producer_id]
    assert [b.base_sequence for b in ours] == [0, 1, 2], [b.base_sequence for b in ours]
    assert {b.producer_epoch for b in ours} == {producer.epoch}
    assert kit.sequence_gaps(ours) == ([], 0)
    records = kit.consume_everything(stack.kipside.bootstrap, [(topic, 0)], at_least=3)
    assert [r.seq for r in sorted(records, key=lambda r: r.offset)] == [0, 1, 2], records
    assert stack.metrics().value("kipside_lane_failures_total") >= 1
    print(
        f"\nkipside: {lanes[0].group(0)}; client connection {how}; broker saw sequences "
        f"{[b.base_sequence for b in ours]}"
    )
