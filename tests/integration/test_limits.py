"""limits.max_connections: kipside refuses client connections past the limit, keeps serving."""

from __future__ import annotations

import socket
import time

import pytest
from inprocess import StartKipside
from testkit.broker import Broker

from kipside.protocol.apis import ApiKey
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.headers import build_frame, encode_request_header

pytestmark = pytest.mark.integration


def _api_versions_roundtrip(sock: socket.socket) -> bytes:
    sock.sendall(build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 7, "limits"), b""))
    decoder = FrameDecoder(min_frame_bytes=4)
    deadline = time.monotonic() + 10
    while (frame := decoder.next_frame()) is None:
        assert time.monotonic() < deadline, "no ApiVersions answer"
        data = sock.recv(65536)
        assert data, "connection closed before the answer"
        decoder.receive_data(data)
    return frame


def test_connections_past_the_limit_are_refused(
    start_kipside_in_process: StartKipside, tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    kipside = start_kipside_in_process(tansu.bootstrap, "limits:\n  max_connections: 2\n")
    host, port = kipside.bootstrap.rsplit(":", 1)
    first = socket.create_connection((host, int(port)), timeout=10)
    second = socket.create_connection((host, int(port)), timeout=10)
    try:
        assert _api_versions_roundtrip(first)[4:8] == (7).to_bytes(4, "big")
        assert _api_versions_roundtrip(second)[4:8] == (7).to_bytes(4, "big")
        third = socket.create_connection((host, int(port)), timeout=10)
        with third:
            third.settimeout(10)
            assert third.recv(1) == b"", "the connection past the limit was not closed"
        # The two within the limit still work.
        assert _api_versions_roundtrip(first)[4:8] == (7).to_bytes(4, "big")
        assert any("limits.max_connections" in r.getMessage() for r in caplog.records)
    finally:
        first.close()
        second.close()
    # Once one closes, a new client gets in again.
    deadline = time.monotonic() + 10
    while kipside.server.stats.client_connections >= 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with socket.create_connection((host, int(port)), timeout=10) as again:
        assert _api_versions_roundtrip(again)[4:8] == (7).to_bytes(4, "big")
