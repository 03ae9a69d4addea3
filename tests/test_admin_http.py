"""Tests for proxy.operations.admin (the HTTP admin endpoint): HTTP broken on purpose
(malformed requests, oversized headers and bodies, Expect: 100-continue), slow clients cut
off at the request deadline, too many connections, and a failing handler.

The endpoint and its clients are tests/admin_kit.py's. Tests with no socket run on trio's
MockClock with autojump (memory streams for HTTP), so deadlines cost no real time. Every test
runs under an absolute trio.fail_after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from admin_kit import (
    CLIENTS,
    REQUEST_DEADLINE,
    TIMEOUT,
    Admin,
    curl,
    fetch,
    h11_request,
    raw_exchange,
)
from admin_kit import admin as admin
from testkit.http import status_of

from kipside.proxy.operations.admin import MAX_BODY_BYTES
from kipside.proxy.operations.admin import httpd as httpd_module

# --------------------------------------------------------------------------- broken HTTP


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"POST /rules/reload HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n",  # TLS
    ],
    ids=["request-line", "header-line", "no-host", "content-length", "tls"],
)
async def test_malformed_request_gets_400(admin: Admin, request_bytes: bytes) -> None:
    with trio.fail_after(TIMEOUT):
        answer = await raw_exchange(admin.port, request_bytes)
    assert status_of(answer) == 400, answer
    assert b"bad request: " in answer


async def test_malformed_request_from_curl_gets_400(admin: Admin) -> None:
    with trio.fail_after(TIMEOUT):
        # A space in the method makes an illegal request line ("GET /x /healthz HTTP/1.1").
        _, answer = await curl(admin.url + "/healthz", "-X", "GET /x")
    assert answer is not None and answer.status == 400


async def test_oversized_headers_get_431(admin: Admin) -> None:
    big = "a" * (20 * 1024)
    with trio.fail_after(TIMEOUT):
        raw = await raw_exchange(
            admin.port, f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n".encode()
        )
        assert status_of(raw) == 431
        _, answer = await curl(admin.url + "/healthz", "-H", f"X-Big: {big}")
        assert answer is not None and answer.status == 431
        # Just under the cap is fine.
        fits = await h11_request(admin.port, "GET", "/healthz", headers=(("x-big", "a" * 15000),))
        assert fits.status == 200


@pytest.mark.parametrize("client", CLIENTS)
async def test_oversized_body_gets_413(admin: Admin, client: str, tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        answer = await fetch(
            client, admin, "POST", "/rules/reload", body=b"x" * (MAX_BODY_BYTES + 1), tmp=tmp_path
        )
        assert answer.status == 413, answer
        # A body within the cap is read and ignored.
        fits = await fetch(
            client, admin, "POST", "/rules/reload", body=b"x" * MAX_BODY_BYTES, tmp=tmp_path
        )
        assert fits.status == 200
    assert admin.server.reloader.rule_reloads == 1  # only the one that fitted


async def test_oversized_chunked_body_gets_413(admin: Admin) -> None:
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(
            admin.port, "POST", "/rules/reload", b"x" * (MAX_BODY_BYTES + 100), chunked=True
        )
    assert answer.status == 413
    assert admin.server.reloader.rule_reloads == 0


async def test_expect_100_continue(admin: Admin, tmp_path: Path) -> None:
    body = tmp_path / "small"
    body.write_bytes(b"x" * 2000)
    with trio.fail_after(TIMEOUT):
        _, answer = await curl(
            admin.url + "/rules/reload",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            f"@{body}",
        )
        assert answer is not None and answer.status == 200
        big = tmp_path / "big"
        big.write_bytes(b"x" * (MAX_BODY_BYTES * 2))
        _, answer = await curl(
            admin.url + "/rules/reload", "-H", "Expect: 100-continue", "--data-binary", f"@{big}"
        )
        assert answer is not None and answer.status == 413


# --------------------------------------------------------------------------- slow clients


@pytest.mark.parametrize(
    "partial",
    [
        b"",
        b"GET /healthz HTTP/1.1\r\nHo",
        b"POST /rules/reload HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 100\r\n\r\nonly part of the body",
    ],
    ids=["silent", "half-headers", "half-body"],
)
async def test_slow_client_is_cut_off_at_the_deadline(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, partial: bytes
) -> None:
    handled: list[bytes] = []

    async def handle(method: bytes, target: bytes, body: bytes) -> httpd_module.Reply:
        handled.append(target)
        return httpd_module.Reply(200, b"ok\n")

    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(httpd_module.serve_connection, server, handle, REQUEST_DEADLINE)
    with trio.fail_after(TIMEOUT):
        start = trio.current_time()
        await client.send_all(partial)
        received = bytearray()
        while chunk := await client.receive_some(65536):
            received += chunk
        answered_after = trio.current_time() - start
        await client.aclose()
    assert status_of(bytes(received)) == 408, received
    assert b"not complete within 0.6 s" in received
    assert answered_after == pytest.approx(REQUEST_DEADLINE)
    assert handled == []


async def test_a_complete_request_is_answered_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    async def handle(method: bytes, target: bytes, body: bytes) -> httpd_module.Reply:
        return httpd_module.Reply(200, method + b" " + target + b" " + body)

    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(httpd_module.serve_connection, server, handle, REQUEST_DEADLINE)
    with trio.fail_after(TIMEOUT):
        start = trio.current_time()
        await client.send_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
        received = bytearray()
        while chunk := await client.receive_some(65536):
            received += chunk
    assert trio.current_time() == start  # no deadline, no linger: the client sent it all
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"\r\n\r\nPOST /x hi")


async def test_slow_curl_upload_is_cut_off(admin: Admin, tmp_path: Path) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"x" * 60_000)  # takes curl ~60 s at 1 KB/s
    with trio.fail_after(TIMEOUT):
        start = trio.current_time()
        _, answer = await curl(
            admin.url + "/rules/reload",
            "-H",
            "Expect:",
            "--limit-rate",
            "1k",
            "--data-binary",
            f"@{body}",
        )
        elapsed = trio.current_time() - start
    assert elapsed < REQUEST_DEADLINE + httpd_module.LINGER_SECONDS + 2
    assert answer is None or answer.status == 408
    assert admin.server.reloader.rule_reloads == 0


async def test_too_many_connections_get_503(admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd_module, "MAX_CONNECTIONS", 1)
    with trio.fail_after(TIMEOUT):
        idle = await trio.open_tcp_stream("127.0.0.1", admin.port)
        async with idle:
            await trio.sleep(0.05)  # the first connection is being served
            busy = await raw_exchange(admin.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status_of(busy) == 503
        await trio.sleep(0.05)
        assert (await h11_request(admin.port, "GET", "/healthz")).status == 200


async def test_a_failing_handler_is_a_500_and_the_endpoint_lives_on(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(body: bytes) -> httpd_module.Reply:
        raise RuntimeError("bug")

    admin.app.routes[b"/healthz"] = ((b"GET",), broken)
    with trio.fail_after(TIMEOUT):
        assert (await h11_request(admin.port, "GET", "/healthz")).status == 500
        assert (await h11_request(admin.port, "GET", "/rules")).status == 200
    assert "GET /healthz failed" in caplog.text
