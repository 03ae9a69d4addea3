"""Every Kafka frame of a capture, reassembled and matched, as scapy layers: the dissector.

`kafka_frames(path)` reads a capture as `kipside pcap summary` does (the same reassembly,
frame splitting and correlation-id matching, every loss counted the same way) but keeps every
frame whole and hands each one over in stream order, with the request a response answers.
Once iterated, its `skipped` holds what the capture made the reading skip.
`CapturedFrame.layer()` dissects a frame with the layers of layers.py (KafkaRequest,
KafkaResponse or KafkaResponseV1 as the request's version says; Raw when bytes were lost).

    from kipside.evidence import kafka_frames
    for frame in kafka_frames("client.pcap", ports=[9092]):
        print(frame.ts, frame.client, "->", frame.server, frame.layer().summary())
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .analyse import skipped_counts
from .capture import CaptureFile
from .connection import Connection
from .decode import RequestSeen, ResponseSeen
from .frames import Frame
from .packets import Segment, tcp_segment
from .table import ConnectionTable

__all__ = ["CapturedFrame", "KafkaFrames", "kafka_frames"]


@dataclass(frozen=True, slots=True)
class CapturedFrame:
    """One Kafka frame of a capture: where and when, and its bytes (size prefix included)."""

    ts: float
    client: str
    server: str
    is_response: bool
    api_key: int
    api_version: int
    correlation_id: int
    data: bytes
    """The whole frame, or its first bytes when the capture lost some (`damaged`)."""
    damaged: bool

    def layer(self) -> Any:
        """The frame as a scapy packet (imports scapy's layers on first use)."""
        from .layers import dissect_request, dissect_response

        if self.damaged:
            from scapy.packet import Raw

            return Raw(self.data)
        if self.is_response:
            return dissect_response(self.data, self.api_key, self.api_version)
        return dissect_request(self.data)


class _Frames:
    """A connection.Listener that keeps every frame."""

    keeps_frames = True

    def __init__(self) -> None:
        self.ready: deque[CapturedFrame] = deque()

    def request(self, connection: Connection, request: RequestSeen) -> None:
        pass

    def response(
        self, connection: Connection, request: RequestSeen, response: ResponseSeen, ts: float
    ) -> None:
        pass

    def closed(self, connection: Connection) -> None:
        pass

    def frame(
        self, connection: Connection, frame: Frame, request: RequestSeen, is_response: bool
    ) -> None:
        self.ready.append(
            CapturedFrame(
                frame.ts,
                str(connection.client),
                str(connection.server),
                is_response,
                request.api_key,
                request.api_version,
                request.correlation_id,
                frame.data,
                frame.damaged or not frame.complete,
            )
        )


class KafkaFrames:
    """The frames of one capture, iterated once; then `skipped` says what the capture made the
    reading skip, under the names of Summary.skipped."""

    def __init__(self, path: str | Path, ports: Iterable[int] = ()) -> None:
        self.path = Path(path)
        self.ports = frozenset(ports)
        self.skipped: dict[str, int] = {}

    def __iter__(self) -> Iterator[CapturedFrame]:
        frames = _Frames()
        table = ConnectionTable(frames, self.ports)
        not_segments: Counter[str] = Counter()
        with CaptureFile(self.path) as capture:
            for ts, linktype, data, wirelen in capture:
                segment = tcp_segment(linktype, data, wirelen)
                if isinstance(segment, Segment):
                    table.segment(ts, segment)
                    while frames.ready:
                        yield frames.ready.popleft()
                else:
                    not_segments[segment] += 1
            table.close_all()
            while frames.ready:
                yield frames.ready.popleft()
        self.skipped = skipped_counts(capture.counts, not_segments, table)


def kafka_frames(path: str | Path, ports: Iterable[int] = ()) -> KafkaFrames:
    """Every Kafka frame in a capture, in the order they completed (see the module's doc)."""
    return KafkaFrames(path, ports)
