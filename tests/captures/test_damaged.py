"""Captures that lack, repeat or reorder bytes still give a summary, with what was skipped counted.

Each case damages a copy of golden/coalescing/client.pcap the way captures get damaged (a
retransmitted segment, segments captured out of order, a segment the capture lost, a packet cut
by a short snap length, a file cut while being written) and checks the damage is counted
exactly and everything it did not touch is still counted as in the whole capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from captures import pcapkit
from kipside.evidence import Summary, summarize
from kipside.evidence.packets import Segment, tcp_segment

GOLDEN = Path(__file__).resolve().parent / "golden" / "coalescing" / "client.pcap"


@dataclass(frozen=True)
class DataPacket:
    index: int
    segment: Segment
    flow: tuple[Any, ...]

    @property
    def payload(self) -> bytes:
        return bytes(self.segment.payload)

    @property
    def api_key(self) -> int:
        return int.from_bytes(self.payload[4:6], "big", signed=True)

    def one_frame(self) -> bool:
        return int.from_bytes(self.payload[:4], "big") + 4 == len(self.payload)


@pytest.fixture(scope="module")
def records() -> list[pcapkit.Record]:
    return pcapkit.read_pcap(GOLDEN)


@pytest.fixture(scope="module")
def whole() -> Summary:
    return summarize(GOLDEN)


def data_packets(records: list[pcapkit.Record]) -> list[DataPacket]:
    out = []
    for i, r in enumerate(records):
        seg = tcp_segment(1, r.data, r.wirelen)
        if isinstance(seg, Segment) and len(seg.payload):
            out.append(DataPacket(i, seg, (seg.src, seg.sport, seg.dst, seg.dport)))
    return out


def produce_requests(records: list[pcapkit.Record], whole: Summary) -> list[DataPacket]:
    """Client packets carrying exactly one Produce request, each followed by more data from
    the same client connection (so a hole in its place is seen)."""
    packets = data_packets(records)
    servers = {int(server.rsplit(":", 1)[1]) for server in whole.connections}
    return [
        p
        for n, p in enumerate(packets)
        if p.segment.dport in servers
        and p.api_key == 0
        and p.one_frame()
        and any(q.flow == p.flow for q in packets[n + 1 :])
    ]


def figures(summary: Summary) -> dict[str, Any]:
    """What damage elsewhere must not change: counts, not timings."""
    return {
        "requests": {n: (a.requests, a.responses, a.errors) for n, a in summary.apis.items()},
        "produce": summary.produce,
        "transactions": summary.transactions,
        "connections": summary.connections,
    }


def skipped(summary: Summary) -> dict[str, int]:
    return {reason: n for reason, n in summary.skipped.items() if n}


def damaged(tmp_path: Path, records: list[pcapkit.Record]) -> Summary:
    return summarize(pcapkit.write_pcap(tmp_path / "damaged.pcap", records))


def test_retransmitted_segments_are_dropped(
    tmp_path: Path, records: list[pcapkit.Record], whole: Summary
) -> None:
    picks = [p.index for p in data_packets(records)[5:8]]
    summary = damaged(tmp_path, pcapkit.duplicated(records, picks))
    assert skipped(summary) == {"retransmitted": 3}
    assert figures(summary) == figures(whole)


def test_segments_captured_out_of_order_are_put_back_in_order(
    tmp_path: Path, records: list[pcapkit.Record], whole: Summary
) -> None:
    packets = data_packets(records)
    first = next(p for n, p in enumerate(packets) if p.flow in {q.flow for q in packets[n + 1 :]})
    second = next(q for q in packets if q.flow == first.flow and q.index > first.index)
    reordered = list(records)
    reordered.insert(first.index, reordered.pop(second.index))
    summary = damaged(tmp_path, reordered)
    assert skipped(summary) == {"out_of_order": 1}
    assert figures(summary) == figures(whole)


def test_a_lost_segment_costs_the_requests_it_carried(
    tmp_path: Path, records: list[pcapkit.Record], whole: Summary
) -> None:
    lost = produce_requests(records, whole)[3]
    summary = damaged(tmp_path, pcapkit.dropped(records, lost.index))
    found = skipped(summary)
    unmatched = found.pop("unmatched_responses", 0)
    assert found == {
        "gaps": 1,  # given up at once: kipside had acknowledged the bytes the capture lacks
        "gap_bytes": len(lost.payload),
        "frames_resyncs": 1,  # the hole took a frame's head: the next one was searched for
    }
    assert unmatched <= 1  # its answer, unless it was an acks=0 request
    assert summary.api("Produce").requests == whole.api("Produce").requests - 1
    assert summary.requests == whole.requests - 1


def test_a_packet_cut_by_the_snap_length_keeps_its_request_counted(
    tmp_path: Path, records: list[pcapkit.Record], whole: Summary
) -> None:
    cut = produce_requests(records, whole)[2]
    headers = len(records[cut.index].data) - len(cut.payload)
    summary = damaged(tmp_path, pcapkit.snapped(records, cut.index, headers + 20))
    found = skipped(summary)
    # If it was acks=0 (its acks were in the lost bytes), it waits for an answer until the
    # client closes the connection.
    assert found.pop("unanswered", 0) + found.pop("abandoned", 0) <= 1
    assert found == {
        "snap_cut": 1,
        "snap_bytes": len(cut.payload) - 20,
        "frames_damaged": 1,
        "unread_requests": 1,
    }
    assert summary.requests == whole.requests  # its head was captured
    assert summary.produce.unread == 1
    assert summary.produce.batches < whole.produce.batches


def test_a_file_cut_inside_a_packet_is_counted(tmp_path: Path, whole: Summary) -> None:
    data = GOLDEN.read_bytes()
    records = pcapkit.read_pcap(GOLDEN)
    last = data_packets(records)[-1]
    # Cut the file 10 bytes into the last data packet's payload, dropping what follows.
    keep = len(pcapkit.pcap_bytes(records[: last.index + 1])) - len(last.payload) + 10
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:keep])
    summary = summarize(path)
    assert summary.skipped["file_cut"] == 1
    assert summary.packets == last.index + 1
    assert summary.requests <= whole.requests


@pytest.mark.parametrize("bytes_short", [1, 9, 17])
def test_a_file_cut_inside_a_record_header_is_counted(tmp_path: Path, bytes_short: int) -> None:
    records = pcapkit.read_pcap(GOLDEN)
    path = tmp_path / "cut.pcap"
    whole_file = GOLDEN.read_bytes()
    path.write_bytes(whole_file[: len(pcapkit.pcap_bytes(records[:-1])) + 16 - bytes_short])
    summary = summarize(path)
    assert summary.skipped["file_cut"] == 1
    assert summary.packets == len(records) - 1


@pytest.mark.parametrize("bytes_short", [1, 4, 10, 60])
def test_a_pcapng_file_cut_inside_its_last_block_is_counted(
    tmp_path: Path, whole: Summary, bytes_short: int
) -> None:
    """pcapng has no record sizes to add up: the file's end must close a block (its last 4
    bytes repeat the block's opening length). The golden capture as pcapng reads the same
    whole, and cut anywhere inside its last block it reads one packet less and says cut."""
    from scapy.utils import rdpcap, wrpcapng

    whole_ng = tmp_path / "whole.pcapng"
    wrpcapng(str(whole_ng), rdpcap(str(GOLDEN)))
    as_ng = summarize(whole_ng)
    assert (as_ng.packets, as_ng.requests, as_ng.skipped["file_cut"]) == (
        whole.packets,
        whole.requests,
        0,
    )
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(whole_ng.read_bytes()[:-bytes_short])
    summary = summarize(cut)
    assert summary.skipped["file_cut"] == 1
    assert summary.packets == whole.packets - 1
