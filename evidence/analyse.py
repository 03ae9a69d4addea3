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
from pathlib import Path
from typing import Final

from .capture import CaptureError, CaptureFile, FileCounts
from .connection import ConversationCounts
from .counts import meanings, skipped_values
from .frames import FrameCounts
from .packets import BAD_HEADER, FRAGMENT, HEADERS_CUT, NOT_IP, NOT_TCP, UNKNOWN_LINK, Segment
from .packets import tcp_segment as _tcp_segment
from .reassembly import ReassemblyCounts
from .summary import Summary, SummaryBuilder
from .table import ConnectionTable, TableCounts

__all__ = ["SKIPPED", "NoKafkaError", "summarize"]

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


_FILE_CUT: Final = "file ending inside a packet record (cut, or copied while being written)"
# Packets that are no TCP segment, by the reasons (packets.SKIP_REASONS) counted together.
_NOT_SEGMENTS: Final = {
    "not_tcp_packets": ((NOT_IP, NOT_TCP), "packets that are not TCP over IP"),
    "unknown_link_packets": ((UNKNOWN_LINK,), "packets of a link type the reader does not know"),
    "ip_fragments": ((FRAGMENT,), "IP fragments (not reassembled)"),
    "headers_cut_packets": ((HEADERS_CUT,), "packets whose headers the snap length cut"),
    "malformed_header_packets": ((BAD_HEADER,), "packets with malformed IP or TCP headers"),
}
SKIPPED: Final = {
    "file_cut": _FILE_CUT,
    **{name: meaning for name, (_, meaning) in _NOT_SEGMENTS.items()},
    **meanings(TableCounts),
    **meanings(ReassemblyCounts),
    **meanings(FrameCounts, "frames_"),
    **meanings(ConversationCounts),
}
"""What each count of Summary.skipped means, in the words the report prints after it."""


def skipped_counts(
    file: FileCounts, not_segments: Counter[str], table: ConnectionTable
) -> dict[str, int]:
    """Every count of what was skipped or guessed, under the names SKIPPED explains."""
    return {
        "file_cut": file.cut_at_end,
        **{
            name: sum(not_segments[reason] for reason in reasons)
            for name, (reasons, _) in _NOT_SEGMENTS.items()
        },
        **skipped_values(table.counts),
        **skipped_values(table.reassembly),
        **skipped_values(table.frames, "frames_"),
        **skipped_values(table.conversation),
    }


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
