"""A client's own broker connection going silent, then the client giving up and closing.

kipside -> FaultRelay -> Tansu. A client whose requests travel on its own broker connection (a
group Heartbeat does) sends one, the path to the broker is blackholed (the connection stays
open, every byte vanishes), the client sends another, hears nothing, and closes. kipside must
then close the session at once: the client's connection and the dark broker connection are
gone from kipside's sockets (no CLOSE_WAIT left behind) well before any answer timeout, and
the session is no longer counted.

Run: .venv/bin/pytest tests/integration/test_faults_own_connection.py -q -p no:cacheprovider
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import pytest
from test_session import heartbeat_request

from kipside.protocol import FrameDecoder, response_correlation_id

from .fault_kit.stack import fault_stack

pytestmark = pytest.mark.integration

BLACKHOLE_SECONDS = 5.0
GONE_WITHIN_SECONDS = 10.0


def read_frame(sock: socket.socket) -> bytes:
    decoder = FrameDecoder(min_frame_bytes=4)
    while (frame := decoder.next_frame()) is None:
        data = sock.recv(65536)
        assert data, "kipside closed the connection"
        decoder.receive_data(data)
    return frame


def sockets_of(pid: int, *, peer_port: int) -> list[str]:
    """kipside's TCP sockets (any state) whose far end is on `peer_port`."""
    return [
        f"{c.laddr} -> {c.raddr} {c.status}"
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == peer_port
    ]


def test_a_client_that_gives_up_on_a_silent_broker_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    # The answer timeout (30 s) is far off: only the client's close may end the session.
    with fault_stack(tmp_path, extra_args=("--upstream-request-timeout", "30")) as stack:
        host, port = stack.bootstrap.rsplit(":", 1)
        client = socket.create_connection((host, int(port)), timeout=10)
        client_port = client.getsockname()[1]
        pid = stack.kipside.pid
        try:
            client.sendall(heartbeat_request(1))
            assert response_correlation_id(read_frame(client)) == 1  # the own connection works
            assert sockets_of(pid, peer_port=stack.relay.port)  # kipside -> relay, open
            stack.relay.blackhole()
            client.sendall(heartbeat_request(2))
            time.sleep(BLACKHOLE_SECONDS)
        finally:
            client.close()
        closed_at = time.monotonic()
        left: list[str] = ["(not checked yet)"]
        while time.monotonic() - closed_at < GONE_WITHIN_SECONDS:
            left = sockets_of(pid, peer_port=client_port) + sockets_of(
                pid, peer_port=stack.relay.port
            )
            if not left:
                break
            time.sleep(0.1)
        assert left == [], f"kipside still holds {left} after the client closed"
        assert time.monotonic() - closed_at < 5.0  # at once, not at an answer timeout
        assert stack.metrics().value("kipside_client_connections") == 0
        stack.relay.restore()
