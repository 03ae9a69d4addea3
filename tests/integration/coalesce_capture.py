"""What clients sent to kipside, captured on loopback with scapy and read back by
kipside.evidence (the `kipside pcap` reader: TCP reassembled per connection, frames split), so
that a test knows byte for byte what each client sent without trusting kipside's proxy.

Only the client -> kipside direction is captured. A kernel drop, a connection whose SYN was
not captured, a hole, a segment cut short or a capture ending inside a frame fails the test:
the capture must never report less than the clients sent.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relays import BatchSeen, produce_batches
from testkit import tools

from kipside.evidence import kafka_frames
from kipside.protocol.apis import ApiKey

SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_RCVBUFFORCE = 33
SNAPLEN = 1 << 18  # lo's MTU is 65536 and GSO hands whole 64 KiB segments to packet sockets


def _open_loopback_socket(bpf: str) -> Any:
    """A scapy L2ListenSocket on lo that keeps whole packets and copes with bursts.

    scapy compiles filters with a 65535-byte snap length (cutting 64 KiB loopback segments)
    and uses a 64 KiB receive buffer; this socket compiles the filter itself with a larger
    snap length, forces a 64 MiB buffer, skips the duplicate PACKET_OUTGOING copy that lo
    shows of every packet, and hands scapy raw bytes (dissected after the capture).
    """
    tools.require_library("pcap", "the capture compiles its BPF filter with libpcap")
    import ctypes

    from scapy.arch.linux import L2ListenSocket
    from scapy.config import conf
    from scapy.data import DLT_EN10MB, SO_ATTACH_FILTER
    from scapy.libs.structures import bpf_program, sock_fprog
    from scapy.libs.winpcapy import (
        pcap_close,
        pcap_compile,
        pcap_freecode,
        pcap_geterr,
        pcap_open_dead,
    )

    class RawLoopbackSocket(L2ListenSocket):
        def recv_raw(self, x: int = 0) -> tuple[Any, Any, Any]:
            pkt, sa_ll, ts = self._recv_raw(self.ins, SNAPLEN)
            if sa_ll[2] == socket.PACKET_OUTGOING:
                return None, None, None
            return conf.raw_layer, pkt, ts

    # scapy warns that it cannot name lo's link type; the bytes are dissected as Ether later.
    scapy_log = logging.getLogger("scapy.runtime")
    level = scapy_log.level
    scapy_log.setLevel(logging.ERROR)
    try:
        sock = RawLoopbackSocket(iface="lo", nofilter=1)
    finally:
        scapy_log.setLevel(level)
    pcap = pcap_open_dead(DLT_EN10MB, SNAPLEN)
    program = bpf_program()
    try:
        if pcap_compile(pcap, ctypes.byref(program), bpf.encode(), 1, -1) == -1:
            raise RuntimeError(f"bad BPF filter {bpf!r}: {pcap_geterr(pcap)}")
        fprog = sock_fprog(program.bf_len, program.bf_insns)
        sock.ins.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))
        pcap_freecode(ctypes.byref(program))
    finally:
        pcap_close(pcap)
    sock.ins.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    sock.ins.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:  # drop what arrived before the filter was attached
            sock.ins.recv(SNAPLEN)
    sock.ins.setblocking(True)
    _packet_stats(sock)  # reading the statistics resets them
    return sock


def _packet_stats(sock: Any) -> tuple[int, int]:
    """(packets, drops) the kernel counted on the packet socket since the last call."""
    raw = sock.ins.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
    packets, drops = struct.unpack("II", raw)
    return packets, drops


@dataclass(frozen=True)
class ClientRequest:
    connection: str
    api_key: int
    api_version: int
    batches: tuple[BatchSeen, ...]


class ClientCapture:
    """What clients sent to kipside, captured on lo with scapy and reassembled per connection."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self._sock: Any = None
        self._sniffer: Any = None
        self.drops = 0
        self.packets = 0

    def start(self) -> None:
        from scapy.sendrecv import AsyncSniffer

        bpf = "tcp and (" + " or ".join(f"dst port {p}" for p in sorted(self.ports)) + ")"
        self._sock = _open_loopback_socket(bpf)
        self._sniffer = AsyncSniffer(opened_socket=self._sock, store=True)
        self._sniffer.start()

    def stop(self, path: Path) -> list[ClientRequest]:
        """Stop capturing, write what was captured to `path` (pcap) and read it back."""
        from scapy.data import DLT_EN10MB
        from scapy.utils import RawPcapWriter

        time.sleep(0.3)  # let the last segments reach the socket
        packets = self._sniffer.stop(join=True)
        self.packets, self.drops = _packet_stats(self._sock)
        self._sock.close()
        assert self.drops == 0, f"the kernel dropped {self.drops} of {self.packets} packets"
        with RawPcapWriter(str(path), linktype=DLT_EN10MB, snaplen=SNAPLEN) as writer:
            writer.write_header(None)
            for p in packets:
                writer.write_packet(bytes(p.load), sec=int(p.time), usec=int(p.time % 1 * 1e6))
        return _client_requests(path, self.ports)


# Lose nothing: repeated or reordered segments (loopback's tail-loss probes retransmit), and
# answers (the capture holds the client -> kipside direction only).
_NOTHING_LOST_BUT = frozenset(
    {"retransmitted", "overlapping", "out_of_order", "unanswered", "abandoned"}
)


def _client_requests(capture: Path, ports: set[int]) -> list[ClientRequest]:
    """Every request in the capture, read by kipside.evidence (the `kipside pcap` reader: TCP
    reassembled per connection, frames split); a connection whose SYN was not captured, a
    hole, a segment cut short or a capture ending inside a frame fails the test."""
    requests = []
    frames = kafka_frames(capture, ports)
    for frame in frames:
        assert not frame.is_response and not frame.damaged, frame
        batches: tuple[BatchSeen, ...] = ()
        if frame.api_key == ApiKey.PRODUCE:
            batches = tuple(produce_batches(frame.data))
        connection = f"{frame.client}->{frame.server}"
        requests.append(ClientRequest(connection, frame.api_key, frame.api_version, batches))
    lost = {why: n for why, n in frames.skipped.items() if n and why not in _NOTHING_LOST_BUT}
    assert not lost, f"{capture}: the capture lacks bytes: {lost}"
    return requests
