"""Kafka frames from one reassembled direction of a captured connection, holes and all.

kipside.protocol's FrameDecoder serves live connections, where a stream that stops making
sense is closed. A capture cannot be closed: it may start inside a frame, lose segments, or end
inside one. FrameSplitter keeps its place by the frames' own size prefixes, so a hole inside a
frame costs that frame's body only: the next frame starts where the size said. Only when a hole
swallows a size prefix (or the capture starts mid-stream) is the place lost; the splitter then
searches the bytes that follow for a plausible frame boundary (Boundaries, from the
conversation: a request header with a known API key, or a response whose correlation id
answers a request seen) and carries on from there. Every byte passed over is counted.

A frame comes out whole only when its reader wants the body (Reader.wants_body); otherwise
only its first HEAD bytes are kept and the rest is skipped as it streams past, so a gigabyte of
Fetch responses costs no memory. Never does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from kipside.protocol import DEFAULT_MAX_FRAME_BYTES, INT32, Buffer, sniff_kafka_request

from .counts import skipped

__all__ = [
    "HEAD",
    "Frame",
    "FrameCounts",
    "FrameSplitter",
    "Reader",
    "RequestBoundaries",
    "ResponseBoundaries",
]

HEAD: Final = 14
"""Bytes of a frame always kept: size, and api key, version, correlation id and client id length
of a request (the correlation id of a response)."""
HUNT_LIMIT: Final = 4 << 20
"""Bytes searched for a frame boundary at most; older ones are dropped (and counted)."""

_SYNC, _BODY, _HUNT = 0, 1, 2
# A request header: a size up to the 100 MiB cap (first byte 0-6), an API key up to 92 and a
# version up to 64, both int16. Candidates only: each is checked by sniff_kafka_request.
_REQUEST_START: Final = re.compile(rb"(?=[\x00-\x06][\x00-\xff]{3}\x00[\x00-\x5c]\x00[\x00-\x40])")
_TLS_RECORD: Final = re.compile(rb"[\x14-\x17]\x03[\x00-\x04]")
_TLS_MAX_RECORD: Final = (1 << 14) + 2048


@dataclass(slots=True, eq=False)
class Frame:
    """One Kafka frame as captured.

    `data` is the whole frame (size prefix included) when `complete`, else its first HEAD
    bytes. `damaged`: the capture lost bytes inside it (its head is intact). `ts` is the time
    of the packet that completed it.
    """

    data: bytes
    size: int
    complete: bool
    damaged: bool
    ts: float


class Reader(Protocol):
    """What a direction's frames are for (the conversation, one per direction)."""

    def wants_body(self, head: bytes) -> bool:
        """Whether a frame starting with `head` (HEAD bytes, fewer for a tiny frame) is kept
        whole."""

    def frame(self, frame: Frame) -> None:
        """A frame, in stream order."""


class Boundaries(Protocol):
    """Where a frame may start in bytes searched after the place was lost."""

    def find(self, buf: bytearray, start: int) -> tuple[int | None, int]:
        """(offset of a frame start at or after `start`, or None; where the next search of the
        same bytes may start)."""


@dataclass
class FrameCounts:
    """What splitting found, added up over every direction of a capture."""

    frames: int = 0
    damaged: int = skipped("frames that lost bytes in the capture (counted, body not read)")
    resyncs: int = skipped("times a stream lost its place and searched for the next frame")
    skipped_bytes: int = skipped("bytes passed over while searching, or in frames cut by the end")
    cut_at_end: int = skipped("frames the capture ended inside of")
    bad_sizes: int = skipped("frame sizes Kafka does not allow")
    """Size prefixes outside what Kafka allows, each of which lost the place."""


class FrameSplitter:
    """One direction's frames, from the reassembled stream (a reassembly.StreamSink)."""

    __slots__ = (
        "_boundaries",
        "_counts",
        "_damaged",
        "_first",
        "_head",
        "_hunt",
        "_hunt_from",
        "_max",
        "_min",
        "_parts",
        "_reader",
        "_remaining",
        "_size",
        "_state",
        "_ts",
    )

    def __init__(
        self,
        reader: Reader,
        boundaries: Boundaries,
        counts: FrameCounts,
        *,
        min_frame_bytes: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._reader = reader
        self._boundaries = boundaries
        self._counts = counts
        self._min = min_frame_bytes
        self._max = max_frame_bytes
        self._state = _SYNC
        self._head = bytearray()  # a frame's first bytes, when they span segments
        self._parts: list[Buffer] | None = None  # the frame's bytes so far, when kept whole
        self._remaining = 0
        self._size = 0
        self._damaged = False
        self._hunt = bytearray()
        self._hunt_from = 0
        self._first = b""
        self._ts = 0.0

    @property
    def hunting(self) -> bool:
        return self._state == _HUNT

    # ------------------------------------------------------------------------- StreamSink

    def data(self, chunk: Buffer, ts: float) -> None:
        self._ts = ts
        rest: Buffer | None = chunk
        while rest is not None:
            rest = self._consume(memoryview(rest), ts)

    def _consume(self, view: memoryview, ts: float) -> bytes | None:
        """Take the bytes in; after a search found a boundary, the bytes from it (to take in
        again)."""
        pos = 0
        end = len(view)
        while pos < end:
            state = self._state
            if state == _BODY:
                take = min(self._remaining, end - pos)
                if self._parts is not None:
                    self._parts.append(view[pos : pos + take])
                self._remaining -= take
                pos += take
                if not self._remaining:
                    self._finish(ts)
            elif state == _SYNC:
                pos = self._start_frame(view, pos, ts)
            else:
                self._hunt += view[pos:end]
                return self._search()
        return None

    def lost(self, size: int) -> None:
        state = self._state
        counts = self._counts
        if state == _BODY and 0 <= size <= self._remaining:
            self._damaged = True
            self._parts = None
            self._remaining -= size
            if not self._remaining:
                self._finish(self._ts)
            return
        if state == _BODY:
            self._finish(self._ts, damaged=True)  # the hole runs on into the next frame's head
        elif state == _HUNT:
            counts.skipped_bytes += len(self._hunt)
            del self._hunt[:]
            self._hunt_from = 0
            return
        counts.skipped_bytes += len(self._head)
        del self._head[:]
        self._lose_place()

    def end(self) -> None:
        """The stream is over: what is left is a frame cut by the end of the capture."""
        counts = self._counts
        if self._state == _BODY:
            counts.cut_at_end += 1
            counts.skipped_bytes += self._size + 4 - self._remaining
        elif self._state == _HUNT:
            counts.skipped_bytes += len(self._hunt)
        elif self._head:
            counts.cut_at_end += 1
            counts.skipped_bytes += len(self._head)
        self._state = _SYNC
        self._parts = None
        del self._head[:]
        del self._hunt[:]

    # ------------------------------------------------------------------------- internals

    def _start_frame(self, view: memoryview, pos: int, ts: float) -> int:
        """Read a frame's head at pos (or what of it this chunk has); return the new pos."""
        head = self._head
        end = len(view)
        if not head and end - pos >= HEAD:
            size: int = INT32.unpack_from(view, pos)[0]
            if not self._min <= size <= self._max:
                self._bad_size()
                return pos
            total = size + 4
            if total <= end - pos:
                frame = view[pos : pos + total]
                self._whole(frame, size, ts)
                return pos + total
            self._begin(bytes(view[pos : pos + HEAD]), size)
            return pos + HEAD
        # The head spans chunks: gather it.
        if len(head) < 4:
            take = min(4 - len(head), end - pos)
            head += view[pos : pos + take]
            pos += take
            if len(head) < 4:
                return pos
            size = INT32.unpack_from(head, 0)[0]
            if not self._min <= size <= self._max:
                self._bad_size(bytes(head))
                del head[:]
                return pos
        size = INT32.unpack_from(head, 0)[0]
        want = min(HEAD, size + 4)
        take = min(want - len(head), end - pos)
        head += view[pos : pos + take]
        pos += take
        if len(head) < want:
            return pos
        data = bytes(head)
        del head[:]
        if want == size + 4:
            self._whole(memoryview(data), size, ts)
        else:
            self._begin(data, size)
        return pos

    def _whole(self, frame: memoryview, size: int, ts: float) -> None:
        head = bytes(frame[:HEAD])
        self._counts.frames += 1
        if len(frame) <= HEAD or self._reader.wants_body(head):
            self._reader.frame(Frame(bytes(frame), size, True, False, ts))
        else:
            self._reader.frame(Frame(head, size, False, False, ts))

    def _begin(self, head: bytes, size: int) -> None:
        self._state = _BODY
        self._size = size
        self._remaining = size + 4 - len(head)
        self._damaged = False
        self._first = head
        self._parts = [head] if self._reader.wants_body(head) else None

    def _finish(self, ts: float, *, damaged: bool = False) -> None:
        counts = self._counts
        counts.frames += 1
        parts = self._parts
        self._state = _SYNC
        self._parts = None
        if damaged or self._damaged or parts is None:
            hurt = damaged or self._damaged
            counts.damaged += hurt
            self._reader.frame(Frame(self._first, self._size, False, hurt, ts))
            return
        self._reader.frame(Frame(b"".join(parts), self._size, True, False, ts))

    def _bad_size(self, head: bytes = b"") -> None:
        self._counts.bad_sizes += 1
        self._lose_place()
        self._hunt += head

    def _lose_place(self) -> None:
        self._counts.resyncs += 1
        self._state = _HUNT
        self._hunt_from = 0

    def _search(self) -> bytes | None:
        """Look for a frame boundary in the bytes gathered since the place was lost; the bytes
        from it, if one was found."""
        hunt = self._hunt
        found, self._hunt_from = self._boundaries.find(hunt, self._hunt_from)
        if found is None:
            if len(hunt) > HUNT_LIMIT:
                drop = len(hunt) - HUNT_LIMIT // 2
                self._counts.skipped_bytes += drop
                del hunt[:drop]
                self._hunt_from = max(0, self._hunt_from - drop)
            return None
        self._counts.skipped_bytes += found
        rest = bytes(hunt[found:])
        del hunt[:]
        self._hunt_from = 0
        self._state = _SYNC
        return rest


# ----------------------------------------------------------------------------- boundaries


def _size_at(buf: bytearray, offset: int) -> int:
    size: int = INT32.unpack_from(buf, offset)[0]
    return size


class RequestBoundaries:
    """Request frame starts: a plausible request header (kipside.protocol.sniff_kafka_request)
    whose frame is followed by another one, or ends exactly where the captured bytes end."""

    def find(self, buf: bytearray, start: int) -> tuple[int | None, int]:
        # The first candidate confirmed by the header after it wins, even over an earlier one
        # whose frame runs past the bytes so far (undecided): next time the search starts at
        # the first undecided one.
        undecided: int | None = None
        for match in _REQUEST_START.finditer(buf, start):
            at = match.start()
            verdict = self._check(buf, at)
            if verdict:
                return at, 0
            if verdict is None and undecided is None:
                undecided = at
        return None, max(start, len(buf) - 7) if undecided is None else undecided

    @staticmethod
    def _check(buf: bytearray, at: int) -> bool | None:
        if sniff_kafka_request(bytes(buf[at : at + 8])) is None:
            return False
        after = at + 4 + _size_at(buf, at)
        if after - at > HUNT_LIMIT:
            return False
        if after == len(buf):
            return True
        if after + 8 > len(buf):
            return None
        return sniff_kafka_request(bytes(buf[after : after + 8])) is not None


class ResponseBoundaries:
    """Response frame starts: a correlation id that a request seen on the connection is waiting
    for, after a plausible size, followed by another such response or the end of the bytes."""

    def __init__(self, waiting: Mapping[int, object], min_size: int = 4) -> None:
        self._waiting = waiting
        self._min = min_size

    def find(self, buf: bytearray, start: int) -> tuple[int | None, int]:
        best: int | None = None
        undecided = False
        for correlation_id in list(self._waiting)[:64]:
            needle = INT32.pack(correlation_id)
            at = buf.find(needle, 4)
            while at != -1 and (best is None or at - 4 < best):
                verdict = self._check(buf, at - 4)
                if verdict:
                    best = at - 4
                    break
                undecided = undecided or verdict is None
                at = buf.find(needle, at + 1)
        if best is not None:
            return best, 0
        return None, 0 if undecided else start

    def _check(self, buf: bytearray, at: int) -> bool | None:
        size = _size_at(buf, at)
        if not self._min <= size <= HUNT_LIMIT:
            return False
        after = at + 4 + size
        if after == len(buf):
            return True
        if after + 8 > len(buf):
            return None
        next_size = _size_at(buf, after)
        return self._min <= next_size <= DEFAULT_MAX_FRAME_BYTES and (
            _size_at(buf, after + 4) in self._waiting
        )


def tls_records(buf: Buffer) -> bool:
    """Whether the bytes hold two TLS records in a row (a capture that began mid-connection on
    a TLS stream: no ClientHello to recognise)."""
    view = memoryview(buf)
    for match in _TLS_RECORD.finditer(view.tobytes()[:65536]):
        at = match.start()
        if at + 5 > len(view):
            return False
        length = int.from_bytes(view[at + 3 : at + 5], "big")
        after = at + 5 + length
        if length > _TLS_MAX_RECORD or after + 5 > len(view):
            continue
        if _TLS_RECORD.match(view[after : after + 3].tobytes()):
            second = int.from_bytes(view[after + 3 : after + 5], "big")
            if second <= _TLS_MAX_RECORD:
                return True
    return False
