"""A capture file in, its Summary out: the file read once, in order, in bounded memory.

capture.CaptureFile streams the packets, packets.tcp_segment finds their TCP segments, the
ConnectionTable sorts them into connections (each reassembled, split into frames and matched),
and a SummaryBuilder adds up what the connections say. Memory follows the connections open at
once and the frames in flight on them (each capped at kipside.protocol's
DEFAULT_MAX_FRAME_BYTES), never the size of the file. `progress` hears (bytes read, file size)
every few thousand packets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Final

from .capture import CaptureError, CaptureFile, FileCounts
from .packets import BAD_HEADER, FRAGMENT, HEADERS_CUT, NOT_IP, NOT_TCP, UNKNOWN_LINK, Segment
from .packets import tcp_segment as _tcp_segment
from .summary import Summary, SummaryBuilder
from .table import ConnectionTable

__all__ = ["NoKafkaError", "summarize"]

Progress = Callable[[int, int], None]
_PROGRESS_EVERY: Final = 4096


class NoKafkaError(CaptureError):
    """The capture holds no Kafka traffic (where the user said to look)."""


def summarize(
    path: str | Path, ports: Iterable[int] = (), progress: Progress | None = None
) -> Summary:
    """Summarise one capture; `ports` are the Kafka servers' ports (all TCP if empty).

    Raises CaptureError for a file that is not a capture, NoKafkaError when nothing in it
    speaks Kafka.
    """
    wanted = frozenset(ports)
    builder = SummaryBuilder(wanted)
    table = ConnectionTable(builder, wanted)
    not_segments: Counter[str] = Counter()
    first = last = None
    segment = table.segment
    tcp_segment = _tcp_segment
    with CaptureFile(path) as capture:
        for count, (ts, linktype, data, wirelen) in enumerate(capture, 1):
            found = tcp_segment(linktype, data, wirelen)
            if first is None:
                first = ts
            last = ts
            if type(found) is Segment:
                segment(ts, found)
            else:
                not_segments[str(found)] += 1
            if progress is not None and not count % _PROGRESS_EVERY:
                progress(capture.position(), capture.size)
        table.close_all()
        if progress is not None:
            progress(capture.size, capture.size)
    summary = builder.summary(
        file=str(path),
        packets=capture.counts.packets,
        file_bytes=capture.size,
        seconds=(last - first) if first is not None and last is not None else 0.0,
        skipped=skipped_counts(capture.counts, not_segments, table),
    )
    if not summary.apis and not summary.connections:
        tls = summary.other_connections.get("TLS", 0)
        if tls:
            raise NoKafkaError(
                f"{path}: TLS: "
                + ("1 connection carries" if tls == 1 else f"{tls} connections carry")
                + " TLS, so its Kafka traffic is encrypted and cannot be read; capture where it "
                "is plaintext (on the far side of whatever terminates TLS)"
            )
        raise NoKafkaError(_no_kafka(Path(path), wanted, capture.counts, table))
    return summary


def skipped_counts(
    file: FileCounts, not_segments: Counter[str], table: ConnectionTable
) -> dict[str, int]:
    """Every count of what was skipped or guessed, under the names report.SKIPPED explains."""
    out = {
        "file_cut": file.cut_at_end,
        "not_tcp_packets": not_segments[NOT_IP] + not_segments[NOT_TCP],
        "unknown_link_packets": not_segments[UNKNOWN_LINK],
        "ip_fragments": not_segments[FRAGMENT],
        "headers_cut_packets": not_segments[HEADERS_CUT],
        "malformed_header_packets": not_segments[BAD_HEADER],
        "other_port_segments": table.counts.other_ports,
        "segments_after_close": table.counts.after_close,
    }
    reassembly = asdict(table.reassembly)
    del reassembly["segments"]
    out.update({f"{name}": value for name, value in reassembly.items()})
    frames = asdict(table.frames)
    del frames["frames"]
    out.update({f"frames_{name}": value for name, value in frames.items()})
    out.update(asdict(table.conversation))
    return out


def _no_kafka(path: Path, ports: frozenset[int], file: FileCounts, table: ConnectionTable) -> str:
    seen = ", ".join(f"{port} ({n} segments)" for port, n in table.port_segments.most_common(6))
    where = f"on port {', '.join(map(str, sorted(ports)))}" if ports else "in any TCP connection"
    if not file.packets:
        return f"{path}: the capture holds no packets"
    if not seen:
        return f"{path}: no TCP traffic among its {file.packets} packets"
    return (
        f"{path}: no Kafka traffic {where} ({file.packets} packets; TCP ports seen: {seen}); "
        "pass --port with the port of the brokers (or of kipside) the capture was taken at"
    )
