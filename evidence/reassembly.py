"""One direction of one TCP connection, reassembled from captured segments into a byte stream.

Segments are handed over in capture order; the stream comes out in sequence order to a
StreamSink, with every byte the capture lacks reported as lost, by count, where it was lost:

- retransmissions (a segment already received) are dropped, and overlaps (partly received)
  trimmed to their new bytes;
- a segment that arrives ahead of a missing predecessor is held (out of order) until the
  predecessor comes; held bytes are bounded, and when the bound is reached, when the peer
  has acknowledged bytes the capture never saw, or when the connection ends, the hole is given up:
  the sink hears how many bytes were lost and the stream carries on after them;
- a segment cut by the capture's snap length delivers what was kept, then the rest as lost;
- a direction whose start was not captured (no SYN: the capture began mid-connection) starts
  with a loss of unknown size.

Every one of these is counted in ReassemblyCounts. Nothing here knows what the bytes mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from kipside.protocol import Buffer

from .counts import skipped

__all__ = ["UNKNOWN_LOSS", "ReassemblyCounts", "StreamSink", "TcpDirection"]

MASK: Final = 0xFFFFFFFF
HALF: Final = 0x80000000
UNKNOWN_LOSS: Final = -1
"""`StreamSink.lost` size when the start of a direction was not captured."""
DEFAULT_HELD_BYTES: Final = 8 << 20
DEFAULT_HELD_SEGMENTS: Final = 512


class StreamSink(Protocol):
    """Where a direction's bytes go, in sequence order."""

    def data(self, chunk: Buffer, ts: float) -> None:
        """The next bytes of the stream; `ts` is the time of the packet that completed them."""

    def lost(self, size: int) -> None:
        """`size` bytes of the stream that the capture lacks (UNKNOWN_LOSS: an unknown amount,
        before the first captured byte)."""


@dataclass
class ReassemblyCounts:
    """What reassembly did, added up over every direction of a capture."""

    segments: int = 0
    """Segments that carried data."""
    retransmitted: int = skipped("retransmitted segments (dropped: already received)")
    overlapping: int = skipped("overlapping segments (trimmed to their new bytes)")
    out_of_order: int = skipped("segments captured ahead of a predecessor (held until it came)")
    """Or until it was given up: then a gap."""
    gaps: int = skipped("holes in a stream that the capture never filled")
    gap_bytes: int = skipped("bytes in those holes")
    snap_cut: int = skipped(
        "segments cut short (by the snap length: capture with -s 0; or by the file's end)"
    )
    snap_bytes: int = skipped("bytes those segments lacked")
    midstream: int = skipped("directions captured from the middle (no SYN)")


def _signed(value: int) -> int:
    """A sequence-number difference as a signed 32-bit distance."""
    return ((value + HALF) & MASK) - HALF


class TcpDirection:
    """Reassembles the segments of one direction of one TCP connection into its StreamSink."""

    __slots__ = (
        "_acked",
        "_counts",
        "_held",
        "_held_bytes",
        "_max_bytes",
        "_max_segments",
        "_next",
        "sink",
    )

    def __init__(
        self,
        sink: StreamSink,
        counts: ReassemblyCounts,
        *,
        max_held_bytes: int = DEFAULT_HELD_BYTES,
        max_held_segments: int = DEFAULT_HELD_SEGMENTS,
    ) -> None:
        self.sink = sink
        self._counts = counts
        self._next: int | None = None
        self._acked: int | None = None  # the highest acknowledgment the peer sent
        self._held: dict[int, tuple[Buffer, int, float]] = {}
        self._held_bytes = 0
        self._max_bytes = max_held_bytes
        self._max_segments = max_held_segments

    @property
    def started(self) -> bool:
        """Whether the direction's position in its sequence space is known."""
        return self._next is not None

    def syn(self, seq: int) -> None:
        """The SYN (or SYN-ACK) of this direction: the stream starts after it."""
        if self._next is None:
            self._next = (seq + 1) & MASK

    def segment(self, seq: int, payload: Buffer, missing: int, ts: float) -> None:
        """A segment carrying `payload` at `seq`, plus `missing` bytes the capture cut off."""
        size = len(payload) + missing
        if not size:
            return
        counts = self._counts
        counts.segments += 1
        if missing:
            counts.snap_cut += 1
            counts.snap_bytes += missing
        if self._next is None:
            counts.midstream += 1
            self._next = seq
            self.sink.lost(UNKNOWN_LOSS)
        ahead = _signed(seq - self._next)
        if ahead == 0:
            self._deliver(payload, missing, ts)
        elif ahead < 0:
            if not self._trimmed(payload, missing, -ahead, ts):
                return
        elif self._acked is not None and _signed(self._acked - seq) >= 0:
            # The peer had acknowledged the bytes before this segment: they are lost.
            counts.gaps += 1
            counts.gap_bytes += ahead
            self.sink.lost(ahead)
            self._next = seq
            self._deliver(payload, missing, ts)
        else:
            counts.out_of_order += 1
            self._hold(seq, payload, missing, ts)
            return
        if self._held:
            self._drain()

    def acked(self, ack: int) -> None:
        """The peer acknowledged everything before `ack`: a hole before it was captured by
        nobody, so give it up now (or as soon as the bytes after it arrive) instead of holding
        what follows it."""
        if self._acked is None or _signed(ack - self._acked) > 0:
            self._acked = ack
        if self._held and self._next is not None and _signed(ack - self._next) > 0:
            self._skip_hole()

    def close(self) -> None:
        """The connection ended (or the capture did): give up every hole, deliver the rest."""
        while self._held:
            self._skip_hole()

    # ----------------------------------------------------------------------------- internals

    def _deliver(self, payload: Buffer, missing: int, ts: float) -> None:
        if payload:
            self.sink.data(payload, ts)
        if missing:
            self.sink.lost(missing)
        assert self._next is not None
        self._next = (self._next + len(payload) + missing) & MASK

    def _trimmed(self, payload: Buffer, missing: int, behind: int, ts: float) -> bool:
        """Deliver the part of a segment beyond what was received; False if nothing was new."""
        counts = self._counts
        if behind >= len(payload) + missing:
            counts.retransmitted += 1
            return False
        counts.overlapping += 1
        if behind >= len(payload):
            missing -= behind - len(payload)
            payload = payload[:0]
        else:
            payload = payload[behind:]
        self._deliver(payload, missing, ts)
        return True

    def _hold(self, seq: int, payload: Buffer, missing: int, ts: float) -> None:
        old = self._held.get(seq)
        if old is not None:
            if len(old[0]) + old[1] >= len(payload) + missing:
                self._counts.retransmitted += 1
                return
            self._held_bytes -= len(old[0])
        self._held[seq] = (payload, missing, ts)
        self._held_bytes += len(payload)
        if self._held_bytes > self._max_bytes or len(self._held) > self._max_segments:
            self._skip_hole()

    def _drain(self) -> None:
        """Deliver held segments that now continue the stream."""
        held = self._held
        while held:
            assert self._next is not None
            nxt = self._next
            seq = min(held, key=lambda s: _signed(s - nxt))
            ahead = _signed(seq - nxt)
            if ahead > 0:
                return
            payload, missing, ts = held.pop(seq)
            self._held_bytes -= len(payload)
            if ahead == 0:
                self._deliver(payload, missing, ts)
            else:
                self._trimmed(payload, missing, -ahead, ts)

    def _skip_hole(self) -> None:
        """Give up the first hole: the sink hears its size, the stream resumes after it."""
        assert self._next is not None
        nxt = self._next
        seq = min(self._held, key=lambda s: _signed(s - nxt))
        hole = _signed(seq - nxt)
        if hole > 0:
            self._counts.gaps += 1
            self._counts.gap_bytes += hole
            self.sink.lost(hole)
            self._next = seq
        self._drain()
