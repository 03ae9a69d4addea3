"""Faults the mirror must report, simulated by filters on the shared relay base (tests/relaykit).

Both are SIMULATIONS in front of a real Tansu broker, which never corrupts a batch and accepts
every write:
- CorruptingFetchRelay flips one byte inside the records of one record batch of a topic in every
  Fetch response that carries it: what a bad disk or a broken network path does. The batch's
  CRC-32C no longer matches.
- RefusingProduceRelay answers every ProduceRequest that names a topic with a prefix with an
  error code for every partition of that request (by default TOPIC_AUTHORIZATION_FAILED): a
  destination that refuses the mirror's writes (ACLs, a topic policy).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from relaykit.base import FORWARD, Answer, Conn, Decision, Relay, Request, response_frame
from relaykit.tansu import start_tansu_advertising

from protocol.apis import ApiKey
from protocol.fetch import MAX_VERSION as FETCH_MAX
from protocol.fetch import MIN_VERSION as FETCH_MIN
from protocol.fetch import parse_fetch_response
from protocol.headers import parse_response_header
from protocol.kafka_errors import ErrorCode
from protocol.produce import (
    PartitionResult,
    ProduceResponseData,
    encode_produce_response,
    parse_produce_request,
)
from protocol.records import HEADER_SIZE, iter_batches


class CorruptingFetchRelay(Relay):
    """SIMULATION: the batch of `topic` that starts at `base_offset` arrives corrupted."""

    def __init__(self, topic: str, base_offset: int) -> None:
        super().__init__()
        self.topic = topic
        self.base_offset = base_offset
        self.corrupted = 0

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        header = request.header
        if header.api_key != ApiKey.FETCH or not FETCH_MIN <= header.api_version <= FETCH_MAX:
            return frame
        body_offset = parse_response_header(frame, ApiKey.FETCH, header.api_version).body_offset
        data = parse_fetch_response(frame, body_offset, header.api_version)
        out = bytearray(frame)
        changed = False
        for p in data.partitions:
            if p.topic != self.topic:
                continue
            for batch in iter_batches(p.records, allow_partial_tail=True):
                if batch.base_offset != self.base_offset or batch.size <= HEADER_SIZE:
                    continue
                where = frame.find(bytes(batch.raw))
                if where >= 0:
                    out[where + HEADER_SIZE] ^= 0xFF  # first byte of the records section
                    changed = True
        if changed:
            with self._lock:
                self.corrupted += 1
        return bytes(out)


class RefusingProduceRelay(Relay):
    """SIMULATION: writes to topics starting with `prefix` are refused with `error_code`."""

    def __init__(self, prefix: str, error_code: int = int(ErrorCode.topic_authorization_failed)):
        super().__init__()
        self.prefix = prefix
        self.error_code = error_code
        self.refused = 0

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        if h.api_key != ApiKey.PRODUCE or h.api_version < 3:
            return FORWARD
        produce = parse_produce_request(request.frame, h.body_offset, h.api_version)
        if not any(p.topic.startswith(self.prefix) for p in produce.partitions):
            return FORWARD
        with self._lock:
            self.refused += 1
        # Nothing of the request is written, so no partition may be reported written.
        results = tuple(
            PartitionResult(p.topic, p.partition, self.error_code) for p in produce.partitions
        )
        body = encode_produce_response(h.api_version, ProduceResponseData(results))
        return Answer(response_frame(h, body))


@dataclass
class RelayedBroker:
    relay: Relay
    broker: subprocess.Popen[bytes]

    @property
    def bootstrap(self) -> str:
        return self.relay.bootstrap


@contextmanager
def broker_behind(relay: Relay) -> Iterator[RelayedBroker]:
    """A fresh Tansu that advertises the relay's address, with the relay in front of it."""
    relay.start()
    proc, port = start_tansu_advertising(relay.port)
    relay.upstream = ("127.0.0.1", port)
    try:
        yield RelayedBroker(relay, proc)
    finally:
        relay.close()
        proc.kill()
        proc.wait(timeout=5)
