"""TCP reassembly and Kafka frame splitting of kipside.evidence, fed by hand: every way a capture
can lack or repeat bytes, each counted, and the frames after it found again.

No files and no sockets: segments go into a TcpDirection, bytes into a FrameSplitter, and the
tests look at what comes out and at the counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from kipside.evidence.frames import (
    Frame,
    FrameCounts,
    FrameSplitter,
    RequestBoundaries,
    ResponseBoundaries,
)
from kipside.evidence.reassembly import UNKNOWN_LOSS, ReassemblyCounts, TcpDirection
from kipside.protocol import ApiKey, Buffer, build_frame, encode_request_header


class Sink:
    """A StreamSink that records what it is given: bytes, and lost sizes as ints."""

    def __init__(self) -> None:
        self.events: list[bytes | int] = []

    def data(self, chunk: Buffer, ts: float) -> None:
        if self.events and isinstance(self.events[-1], bytes):
            self.events[-1] += bytes(chunk)
        else:
            self.events.append(bytes(chunk))

    def lost(self, size: int) -> None:
        self.events.append(size)


def direction(**limits: int) -> tuple[TcpDirection, Sink, ReassemblyCounts]:
    sink, counts = Sink(), ReassemblyCounts()
    stream = TcpDirection(sink, counts, **limits)
    stream.syn(999)  # the stream starts at sequence number 1000
    return stream, sink, counts


DATA = bytes(range(256)) * 4


def test_in_order_segments_make_the_stream() -> None:
    stream, sink, counts = direction()
    for at in range(0, 100, 10):
        stream.segment(1000 + at, DATA[at : at + 10], 0, 0.0)
    assert sink.events == [DATA[:100]]
    assert counts == ReassemblyCounts(segments=10)


def test_a_retransmission_is_dropped_and_an_overlap_trimmed() -> None:
    stream, sink, counts = direction()
    stream.segment(1000, DATA[:10], 0, 0.0)
    stream.segment(1000, DATA[:10], 0, 0.0)  # the same again
    stream.segment(1005, DATA[5:20], 0, 0.0)  # half old, half new
    assert sink.events == [DATA[:20]]
    assert (counts.retransmitted, counts.overlapping) == (1, 1)


def test_a_segment_ahead_of_its_predecessor_waits_for_it() -> None:
    stream, sink, counts = direction()
    stream.segment(1010, DATA[10:20], 0, 0.0)
    assert sink.events == []
    stream.segment(1000, DATA[:10], 0, 0.0)
    assert sink.events == [DATA[:20]]
    assert (counts.out_of_order, counts.gaps) == (1, 0)


@pytest.mark.parametrize(
    "give_up",
    [
        pytest.param(TcpDirection.close, id="when the connection ends"),
        # the receiver had bytes the capture never saw
        pytest.param(lambda stream: stream.acked(1015), id="once the peer acknowledges past it"),
    ],
)
def test_a_hole_never_filled_is_given_up(give_up: Callable[[TcpDirection], None]) -> None:
    stream, sink, counts = direction()
    stream.segment(1000, DATA[:10], 0, 0.0)
    stream.segment(1020, DATA[20:30], 0, 0.0)
    give_up(stream)
    assert sink.events == [DATA[:10], 10, DATA[20:30]]
    assert (counts.gaps, counts.gap_bytes) == (1, 10)


def test_held_segments_are_bounded() -> None:
    stream, sink, counts = direction(max_held_bytes=25)
    stream.segment(1000, DATA[:10], 0, 0.0)
    for at in (20, 30, 40):  # a hole at 10-20, then 30 bytes held: over the bound
        stream.segment(1000 + at, DATA[at : at + 10], 0, 0.0)
    assert sink.events == [DATA[:10], 10, DATA[20:50]]
    assert (counts.out_of_order, counts.gaps) == (3, 1)


def test_a_segment_cut_by_the_snap_length_delivers_what_was_kept() -> None:
    stream, sink, counts = direction()
    stream.segment(1000, DATA[:6], 4, 0.0)
    stream.segment(1010, DATA[10:20], 0, 0.0)
    assert sink.events == [DATA[:6], 4, DATA[10:20]]
    assert (counts.snap_cut, counts.snap_bytes) == (1, 4)


def test_a_direction_captured_from_its_middle_starts_with_an_unknown_loss() -> None:
    sink, counts = Sink(), ReassemblyCounts()
    stream = TcpDirection(sink, counts)
    stream.segment(77777, DATA[:10], 0, 0.0)
    assert sink.events == [UNKNOWN_LOSS, DATA[:10]]
    assert counts.midstream == 1


def test_sequence_numbers_wrap_around() -> None:
    sink, counts = Sink(), ReassemblyCounts()
    stream = TcpDirection(sink, counts)
    stream.syn(0xFFFFFFF9)  # data starts at 2**32 - 6
    stream.segment(0xFFFFFFFA, DATA[:10], 0, 0.0)
    stream.segment(4, DATA[10:20], 0, 0.0)
    stream.segment(0xFFFFFFFA, DATA[:10], 0, 0.0)
    assert sink.events == [DATA[:20]]
    assert counts.retransmitted == 1


# --------------------------------------------------------------------------- frames


def request(correlation_id: int, body_size: int = 30) -> bytes:
    header = encode_request_header(ApiKey.METADATA, 1, correlation_id, "kit")
    return build_frame(header, bytes([correlation_id % 256]) * body_size)


def response(correlation_id: int, body_size: int = 20) -> bytes:
    return build_frame(correlation_id.to_bytes(4, "big"), b"\x00" * body_size)


class Reader:
    """Keeps every frame whole; records each as (first bytes, complete, damaged)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.frames: list[Frame] = []

    def wants_body(self, head: bytes) -> bool:
        return self.keep

    def frame(self, frame: Frame) -> None:
        self.frames.append(frame)


def requests_splitter(keep: bool = True) -> tuple[FrameSplitter, Reader, FrameCounts]:
    reader, counts = Reader(keep), FrameCounts()
    return FrameSplitter(reader, RequestBoundaries(), counts, min_frame_bytes=8), reader, counts


def feed(splitter: FrameSplitter, data: bytes, cuts: list[int]) -> None:
    points = [0, *cuts, len(data)]
    for start, end in itertools.pairwise(points):
        splitter.data(data[start:end], 0.0)


@pytest.mark.parametrize("cuts", [[], [1], [3, 4, 5], [13, 14, 15, 16], [40, 41, 90]])
def test_frames_come_out_whole_wherever_the_segments_end(cuts: list[int]) -> None:
    frames = [request(1), request(2, 5), request(3, 100)]
    splitter, reader, counts = requests_splitter()
    feed(splitter, b"".join(frames), cuts)
    assert [f.data for f in reader.frames] == frames
    assert counts == FrameCounts(frames=3)


def test_a_frame_not_wanted_whole_keeps_its_head_only() -> None:
    splitter, reader, _ = requests_splitter(keep=False)
    feed(splitter, request(1, 200) + request(2, 3), [50])
    header = 2 + 2 + 4 + 2 + len("kit")  # api key, version, correlation id, client id
    assert [(f.data, f.complete, f.size) for f in reader.frames] == [
        (request(1, 200)[:14], False, header + 200),
        (request(2, 3)[:14], False, header + 3),
    ]


def test_bytes_lost_inside_a_frame_damage_it_alone() -> None:
    first, second = request(1, 100), request(2)
    splitter, reader, counts = requests_splitter()
    splitter.data(first[:50], 0.0)
    splitter.lost(30)
    splitter.data(first[80:] + second, 0.0)
    assert [(f.damaged, f.data[:14]) for f in reader.frames] == [
        (True, first[:14]),
        (False, second[:14]),
    ]
    assert reader.frames[1].data == second
    assert (counts.damaged, counts.resyncs, counts.skipped_bytes) == (1, 0, 0)


def test_bytes_lost_across_a_frame_head_are_searched_past() -> None:
    frames = [request(1, 100), request(2, 40), request(3), request(4)]
    stream = b"".join(frames)
    lost_from, lost_to = 50, len(frames[0]) + 6  # into the second frame's head
    splitter, reader, counts = requests_splitter()
    splitter.data(stream[:lost_from], 0.0)
    splitter.lost(lost_to - lost_from)
    splitter.data(stream[lost_to:], 0.0)
    assert [f.data[8:12] for f in reader.frames] == [
        b"\x00\x00\x00\x01",
        *(f[8:12] for f in frames[2:]),
    ]
    assert reader.frames[0].damaged
    assert counts.resyncs == 1
    assert counts.skipped_bytes == len(frames[1]) - 6


def test_a_stream_captured_from_the_middle_of_a_frame_starts_at_the_next_one() -> None:
    frames = [request(1, 300), request(2), request(3, 7)]
    stream = b"".join(frames)
    splitter, reader, counts = requests_splitter()
    splitter.lost(UNKNOWN_LOSS)
    splitter.data(stream[100:], 0.0)
    assert [f.data for f in reader.frames] == frames[1:]
    assert counts.skipped_bytes == len(frames[0]) - 100


def test_an_impossible_size_loses_the_place_until_a_request_appears() -> None:
    splitter, reader, counts = requests_splitter()
    splitter.data(b"\x7f\xff\xff\xff" + b"junk" * 5 + request(9), 0.0)
    assert [f.data for f in reader.frames] == [request(9)]
    assert (counts.bad_sizes, counts.resyncs, counts.skipped_bytes) == (1, 1, 24)


def test_the_end_of_a_capture_inside_a_frame_is_counted() -> None:
    splitter, reader, counts = requests_splitter()
    splitter.data(request(1) + request(2)[:20], 0.0)
    splitter.end()
    assert len(reader.frames) == 1
    assert (counts.cut_at_end, counts.skipped_bytes) == (1, 20)


def test_responses_resynchronise_on_a_correlation_id_being_waited_for() -> None:
    waiting = {7: None, 8: None}
    reader, counts = Reader(), FrameCounts()
    splitter = FrameSplitter(reader, ResponseBoundaries(waiting), counts, min_frame_bytes=4)
    splitter.lost(UNKNOWN_LOSS)
    stream = response(5)[3:] + response(6) + response(7) + response(8)
    splitter.data(stream, 0.0)
    assert [f.data for f in reader.frames] == [response(7), response(8)]
    assert counts.skipped_bytes == len(response(5)) - 3 + len(response(6))
