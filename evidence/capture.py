"""Capture files read packet by packet: pcap and pcapng (gzipped or not), through scapy's readers.

Packets are streamed, never held: a capture of many gigabytes is read in the memory of one
packet. What a file lacks is counted, never fatal: a file that ends inside a packet (a capture
copied while tcpdump still wrote it, or cut with `head -c`) gives every packet before the cut
and the number of bytes the last one lacked. A file that is not a capture at all, or missing,
is a CaptureError whose message says what to do. Knows nothing of TCP or Kafka.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["CaptureError", "CaptureFile", "FileCounts"]

# scapy's readers cut packets to their `size` argument, 65535 by default: less than a loopback
# packet of a 64 KiB TSO/GSO segment with its headers. Read up to what scapy reads at once.
_MAX_PACKET: Final = 4 * 0xFFFF
_PCAP_HEADER: Final = 24
_PCAP_RECORD_HEADER: Final = 16
_PCAPNG_MIN_BLOCK: Final = 12  # type, length, closing length
_HOW_TO_CAPTURE: Final = (
    "capture with `tcpdump -i IFACE -s 0 -w FILE 'tcp port PORT'` (or `tshark -w FILE`): "
    "pcap and pcapng files are read, gzipped or not"
)


class CaptureError(Exception):
    """A capture file that cannot be read at all; the message names the file and the fix."""


@dataclass
class FileCounts:
    """What reading the file itself found."""

    packets: int = 0
    captured_bytes: int = 0
    cut_at_end: int = 0
    """1 when the file ends inside a packet record (it was cut, or copied while written): the
    last packet is incomplete, or missing if its record header is."""
    link_types: dict[int, int] = field(default_factory=dict)
    """Packets per link type."""


class CaptureFile:
    """One capture file, iterated as (timestamp, link type, packet bytes, length on the wire)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.counts = FileCounts()
        if not self.path.exists():
            raise CaptureError(f"{self.path}: no such file; {_HOW_TO_CAPTURE}")
        if not self.path.is_file():
            raise CaptureError(f"{self.path}: not a file; give the path of a capture file")
        self.size = self.path.stat().st_size
        self._reader = _open_reader(self.path)
        self._pcapng = type(self._reader).__name__ == "RawPcapNgReader"
        self._gzipped = isinstance(self._reader.f, gzip.GzipFile)

    def position(self) -> int:
        """How far into the file reading has come (bytes), for progress reports."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            raw = self._reader.f
            fileobj = getattr(raw, "fileobj", None)  # a gzip file: its compressed position
            return int((fileobj or raw).tell())
        return 0

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> CaptureFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[float, int, bytes, int]]:
        reader = self._reader
        counts = self.counts
        link_types = counts.link_types
        read = reader._read_packet  # the reader's own iterator cuts packets at 65535 bytes
        pcapng = self._pcapng
        # pcap: one link type and timestamp unit for the file, and record sizes that add up to
        # the file's size unless it was cut; pcapng: both per packet (interface), no such sum.
        linktype = 0 if pcapng else reader.linktype
        scale = 1e-9 if not pcapng and reader.nano else 1e-6
        records_end = _PCAP_HEADER  # where a pcap file would end after each record
        scapy_log = logging.getLogger("scapy.runtime")
        level = scapy_log.level
        scapy_log.setLevel(logging.CRITICAL)  # a cut packet is counted, not warned of
        try:
            while True:
                try:
                    data, meta = read(_MAX_PACKET)
                except EOFError:
                    break
                if pcapng:
                    linktype = meta.linktype
                    ts = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
                else:
                    ts = meta.sec + meta.usec * scale
                    records_end += _PCAP_RECORD_HEADER + meta.caplen
                counts.packets += 1
                counts.captured_bytes += len(data)
                link_types[linktype] = link_types.get(linktype, 0) + 1
                yield ts, linktype, data, meta.wirelen
        finally:
            scapy_log.setLevel(level)
        if pcapng:
            self._count_trailing_bytes()
        elif not self._gzipped and self.size != records_end:
            counts.cut_at_end = 1

    def _count_trailing_bytes(self) -> None:
        """Whether the pcapng file was cut inside a block. The reader gives up on a cut block
        quietly, having read to the end of the file, so the file's last bytes are checked: a
        whole pcapng file ends with a block whose closing length (its last 4 bytes) repeats its
        opening one. Not checked for a gzipped file (no cheap seek)."""
        if self._gzipped:
            return
        with contextlib.suppress(OSError, ValueError, AttributeError, struct.error):
            if not _ends_on_a_block(self._reader.f, self.size, self._reader.endian):
                self.counts.cut_at_end = 1


def _ends_on_a_block(f: Any, size: int, endian: str) -> bool:
    """Whether a pcapng file of `size` bytes ends where a whole block ends."""
    length = struct.Struct(endian + "I")
    if size < _PCAPNG_MIN_BLOCK:
        return False
    f.seek(size - 4)
    (total,) = length.unpack(f.read(4))
    start = size - total
    if total < _PCAPNG_MIN_BLOCK or total % 4 or start < 0:
        return False
    f.seek(start + 4)
    (opening,) = length.unpack(f.read(4))
    return bool(opening == total)


def _open_reader(path: Path) -> Any:
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapReader

    try:
        return RawPcapReader(str(path))
    except (Scapy_Exception, EOFError, OSError) as exc:
        with path.open("rb") as f:
            head = f.read(4)
        what = "an empty file" if not head else f"it starts with bytes {head.hex(' ')}"
        raise CaptureError(
            f"{path}: not a pcap or pcapng capture ({what}; {exc}); {_HOW_TO_CAPTURE}"
        ) from None
