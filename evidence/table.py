"""Captured TCP segments sorted into connections: which side is the client, when one begins and
ends, and which segments belong to none.

The client is the side that sent the SYN (or received the SYN-ACK). For a connection whose
start was not captured, the server is the side on one of the `--port` ports, else an endpoint
already seen accepting connections, else the lower port (clients' ports are ephemeral). A
connection is summarised and dropped as soon as both sides sent FIN, or either RST, so memory
follows the connections open at once, not the length of the capture; the last few thousand
closed ones are remembered so that their late retransmissions start nothing new.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Final

from .connection import Connection, ConversationCounts, Endpoint, Listener
from .counts import skipped
from .frames import FrameCounts
from .packets import ACK, FIN, RST, SYN, Segment
from .reassembly import ReassemblyCounts

__all__ = ["ConnectionTable", "TableCounts"]

_REMEMBER_CLOSED: Final = 4096
_REMEMBER_SERVERS: Final = 4096
_Key = tuple[bytes, int, bytes, int]


@dataclass
class TableCounts:
    other_port_segments: int = skipped("TCP segments on other ports than --port")
    segments_after_close: int = skipped(
        "segments of connections already closed (late retransmissions)"
    )


class ConnectionTable:
    """The connections of one capture, fed its TCP segments in capture order."""

    def __init__(self, listener: Listener, ports: frozenset[int] = frozenset()) -> None:
        self.listener = listener
        self.ports = ports
        self.counts = TableCounts()
        self.conversation = ConversationCounts()
        self.reassembly = ReassemblyCounts()
        self.frames = FrameCounts()
        self.port_segments: Counter[int] = Counter()
        """Segments per port (either end), to say what the capture holds when no Kafka is found."""
        self._open: dict[_Key, tuple[Connection, bool]] = {}
        self._closed: OrderedDict[_Key, None] = OrderedDict()
        self._servers: OrderedDict[Endpoint, None] = OrderedDict()
        self._fins: dict[Connection, int] = {}

    def segment(self, ts: float, seg: Segment) -> None:
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        entry = self._open.get(key)
        flags = seg.flags
        if entry is None:
            self.port_segments[seg.sport] += 1
            self.port_segments[seg.dport] += 1
            entry = self._start(ts, key, seg)
            if entry is None:
                return
        connection, from_client = entry
        connection.last_ts = ts
        if from_client:
            direction, other = connection.requests, connection.responses
        else:
            direction, other = connection.responses, connection.requests
        seq = seg.seq
        if flags & SYN:
            if from_client and not flags & ACK and direction.started and connection.kind:
                # The same addresses and ports, a new connection (the old one's end unseen).
                self._finish(connection)
                entry = self._start(ts, key, seg)
                if entry is None:
                    return
                connection, from_client = entry
                direction, other = connection.requests, connection.responses
            direction.syn(seq)
            seq = (seq + 1) & 0xFFFFFFFF
        if seg.payload or seg.missing:
            direction.segment(seq, seg.payload, seg.missing, ts)
        if flags & ACK:
            other.acked(seg.ack)
        if flags & (FIN | RST):
            fins = self._fins.get(connection, 0) | (1 if from_client else 2)
            if from_client and not fins & 2:
                connection.client_closed_first = True
            if flags & RST or fins == 3:
                self._finish(connection)
            else:
                self._fins[connection] = fins

    def close_all(self) -> None:
        """The capture is over: every connection still open ends here."""
        for connection in list({c for c, _ in self._open.values()}):
            self._finish(connection)

    def _start(self, ts: float, key: _Key, seg: Segment) -> tuple[Connection, bool] | None:
        flags = seg.flags
        src, dst = Endpoint(seg.src, seg.sport), Endpoint(seg.dst, seg.dport)
        ports = self.ports
        if ports and seg.sport not in ports and seg.dport not in ports:
            self.counts.other_port_segments += 1
            return None
        syn = bool(flags & SYN)
        if not syn and not (seg.payload or seg.missing):
            return None  # a bare ACK, FIN or RST of a connection not seen
        if not syn and key in self._closed:
            self.counts.segments_after_close += 1
            return None
        if syn:
            from_client = not flags & ACK
        elif ports and (seg.sport in ports) != (seg.dport in ports):
            from_client = seg.dport in ports
        elif src in self._servers or dst in self._servers:
            from_client = dst in self._servers
        else:
            from_client = seg.sport > seg.dport
        client, server = (src, dst) if from_client else (dst, src)
        connection = Connection(
            client,
            server,
            self.listener,
            self.conversation,
            self.reassembly,
            self.frames,
            ts,
        )
        if syn:
            self._servers[server] = None
            if len(self._servers) > _REMEMBER_SERVERS:
                self._servers.popitem(last=False)
            if not from_client:  # the SYN-ACK: the client's SYN was not captured
                connection.requests.syn((seg.ack - 1) & 0xFFFFFFFF)
        else:
            connection.midstream = True
        reverse = (seg.dst, seg.dport, seg.src, seg.sport)
        self._closed.pop(key, None)
        self._closed.pop(reverse, None)
        self._open[key] = (connection, from_client)
        self._open[reverse] = (connection, not from_client)
        return connection, from_client

    def _finish(self, connection: Connection) -> None:
        client, server = connection.client, connection.server
        for key in (
            (client.ip, client.port, server.ip, server.port),
            (server.ip, server.port, client.ip, client.port),
        ):
            if self._open.pop(key, None) is not None:
                self._closed[key] = None
        while len(self._closed) > _REMEMBER_CLOSED:
            self._closed.popitem(last=False)
        self._fins.pop(connection, None)
        connection.close()
