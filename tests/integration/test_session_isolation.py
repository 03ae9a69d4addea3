"""An unexpected error while serving one client ends that client's connection only: kipside logs
it with its traceback and goes on serving everyone else (a bug must never stop the proxy)."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from inprocess import StartKipside
from testkit.broker import Broker

from kipside.protocol import (
    ApiKey,
    FrameDecoder,
    RequestHeader,
    build_frame,
    encode_request_header,
)
from kipside.proxy.session.session import Session

pytestmark = pytest.mark.integration


def _api_versions(sock: socket.socket, client_id: str) -> bytes | None:
    """The ApiVersions answer, or None if kipside closed the connection instead."""
    sock.sendall(build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 7, client_id), b""))
    decoder = FrameDecoder(min_frame_bytes=4)
    deadline = time.monotonic() + 10
    while (frame := decoder.next_frame()) is None:
        assert time.monotonic() < deadline, "neither an answer nor a close"
        data = sock.recv(65536)
        if not data:
            return None
        decoder.receive_data(data)
    return frame


def test_an_unexpected_error_closes_one_connection_and_kipside_serves_on(
    start_kipside_in_process: StartKipside,
    tansu: Broker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kipside = start_kipside_in_process(tansu.bootstrap, "")
    host, port = kipside.bootstrap.rsplit(":", 1)
    handle = Session.handle

    async def faulty(self: Session, header: RequestHeader, frame: bytes, now: float) -> None:
        if self.client_id == "trips-a-bug":
            raise RuntimeError("a bug in kipside")
        await handle(self, header, frame, now)

    monkeypatch.setattr(Session, "handle", faulty)
    with caplog.at_level(logging.ERROR, logger="kipside.server"):
        bystander = socket.create_connection((host, int(port)), timeout=10)
        victim = socket.create_connection((host, int(port)), timeout=10)
        try:
            assert _api_versions(bystander, "bystander") is not None
            assert _api_versions(victim, "trips-a-bug") is None
            # The server is still up: the open connection and a new one are both served.
            assert _api_versions(bystander, "bystander") is not None
            with socket.create_connection((host, int(port)), timeout=10) as later:
                assert _api_versions(later, "later") is not None
        finally:
            bystander.close()
            victim.close()
    errors = [r for r in caplog.records if "unexpected error in kipside" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    assert "client.id 'trips-a-bug'" in errors[0].getMessage()
    assert errors[0].exc_info is not None
