"""Tests for proxy.operations.admin (the HTTP admin endpoint) and proxy.operations.reload
(rule hot reload).

The endpoint runs in-process on a loopback listener (port 0) in front of a real, unserved
Server; requests come from an h11 client, from raw bytes where HTTP has to be broken on
purpose, and from curl (/usr/bin/curl) in a subprocess, so both a sans-I/O client and a real
one see every answer. The fake upstream broker is a loopback listener that accepts and closes.
/metrics is read with prometheus_client's parser (testkit.metrics). Tests with no socket run
on trio's MockClock with autojump (memory streams for HTTP, the file watcher's polls in
virtual time), so deadlines and poll intervals cost no real time.
Every test runs under an absolute trio.fail_after.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
import trio
import trio.testing
from testkit.http import Answer, Exchange, Request, curl_answer, status_of
from testkit.metrics import parse

from kipside.protocol import Address
from kipside.protocol.apis import ApiKey
from kipside.proxy.cli import _admin_address, main
from kipside.proxy.features.coalesce import Coalescer
from kipside.proxy.features.context import FeatureContext
from kipside.proxy.network.identity import ANONYMOUS
from kipside.proxy.operations.admin import MAX_BODY_BYTES, AdminApp, RateWindow, serve_admin
from kipside.proxy.operations.admin import httpd as httpd_module
from kipside.proxy.operations.reload import POLL_SECONDS, apply_rules
from kipside.proxy.server import Server, ServerConfig
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet, load_rules, parse_rules

TIMEOUT = 10
REQUEST_DEADLINE = 0.6
CURL = shutil.which("curl") or "/usr/bin/curl"

RULES_V1 = "coalescing:\n  linger_ms: 5\n"
RULES_V2 = (
    "coalescing:\n"
    "  linger_ms: 7\n"
    "  max_request_bytes: 2048\n"
    "  rules:\n"
    '    - {topic: "audit.*", coalesce: false}\n'
)
RULES_INVALID = "coalescing:\n  lanes: 0\n  bogus: 1\n"
TXN_RULES = "transactions:\n  - transactional_id: 'orders-*'\n    outputs: [{topic: orders}]\n"


# --------------------------------------------------------------------------- the endpoint


@dataclass
class Admin:
    server: Server
    app: AdminApp
    port: int
    rules_path: Path
    broker: trio.SocketListener

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _accept_and_close(listener: trio.SocketListener) -> None:
    with contextlib.suppress(trio.ClosedResourceError):  # a test closed the "broker"
        while True:
            stream = await listener.accept()
            await trio.aclose_forcefully(stream)


def make_server(rules_path: Path | None, upstream_port: int) -> Server:
    rules = load_rules(rules_path) if rules_path is not None else RuleSet()
    return Server(
        ServerConfig(
            upstreams=[Address("127.0.0.1", upstream_port)],
            listen=Address("127.0.0.1", 0),
            rules=rules,
        )
    )


@pytest.fixture
async def admin(tmp_path: Path, nursery: trio.Nursery) -> Admin:
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(RULES_V1)
    (broker,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(_accept_and_close, broker)
    server = make_server(rules_path, broker.socket.getsockname()[1])
    server.ready.set()
    app = AdminApp(server, request_deadline=REQUEST_DEADLINE)
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(serve_admin, listener, app)
    return Admin(server, app, listener.socket.getsockname()[1], rules_path, broker)


# --------------------------------------------------------------------------- clients


async def h11_request(
    port: int,
    method: str,
    target: str,
    body: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
    chunked: bool = False,
) -> Answer:
    exchange = Exchange(Request(port, method, target, body, headers, chunked))
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        # The server may answer early (413) and close; its answer is still readable.
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(exchange.request)
        while (answer := exchange.receive(await stream.receive_some(65536))) is None:
            pass
        return answer


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send bytes as they are and read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = bytearray()
        while chunk := await stream.receive_some(65536):
            received += chunk
        return bytes(received)


async def curl(url: str, *args: str, max_time: float = TIMEOUT) -> tuple[int, Answer | None]:
    """(curl's exit code, the final answer or None if curl got none)."""
    result = await trio.run_process(
        [CURL, "-s", "-i", "--max-time", str(max_time), *args, url],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return result.returncode, curl_answer(result.stdout)


CLIENTS = ["h11", "curl"]


async def fetch(
    client: str,
    admin: Admin,
    method: str,
    path: str,
    body: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
    tmp: Path | None = None,
) -> Answer:
    if client == "h11":
        return await h11_request(admin.port, method, path, body, headers)
    args = ["-I"] if method == "HEAD" else ["-X", method]
    for name, value in headers:
        args += ["-H", f"{name}: {value}"]
    if body:
        assert tmp is not None
        body_file = tmp / "body.bin"
        body_file.write_bytes(body)
        args += ["--data-binary", f"@{body_file}"]
    code, answer = await curl(admin.url + path, *args)
    assert answer is not None, f"curl exit {code}, no answer"
    return answer


# --------------------------------------------------------------------------- each path


@pytest.mark.parametrize("client", CLIENTS)
async def test_each_path_answers(admin: Admin, client: str, tmp_path: Path) -> None:
    rules = admin.server.rules
    with trio.fail_after(TIMEOUT):
        health = await fetch(client, admin, "GET", "/healthz")
        assert (health.status, health.body) == (200, b"ok\n")
        assert health.headers["connection"] == "close"

        ready = await fetch(client, admin, "GET", "/readyz")
        assert ready.status == 200, ready.body
        assert ready.body.startswith(b"ready: broker 127.0.0.1:")
        assert rules.version.encode() in ready.body

        metrics = await fetch(client, admin, "GET", "/metrics")
        assert metrics.status == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        scraped = parse(metrics.body.decode())
        assert scraped.value("kipside_rules_info", version=rules.version, source=rules.source) == 1
        assert scraped.value("kipside_rule_reloads_total") == 0
        assert scraped.value("kipside_rule_reload_errors_total") == 0
        assert scraped.value("kipside_client_connections") == 0
        assert scraped.value("kipside_build_info", version=version("kipside")) == 1

        got = await fetch(client, admin, "GET", "/rules")
        assert got.status == 200 and got.headers["content-type"] == "application/json"
        assert got.json() == rules.describe()

        status = await fetch(client, admin, "GET", "/status.json")
        figures = status.json()
        assert isinstance(figures, dict)
        assert figures["rules"]["version"] == rules.version
        assert figures["connections"] == {"client": 0, "upstream": 0}
        assert figures["kipside_version"] == version("kipside")

        page = await fetch(client, admin, "GET", "/")
        assert page.status == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "connect-src 'self'" in policy and "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
        html = page.body.decode()
        assert 'id="rules-version"' in html and 'id="client-connections"' in html
        assert '<script src="/static/status.js">' in html
        assert '<link rel="stylesheet" href="/static/status.css">' in html
        script = await fetch(client, admin, "GET", "/static/status.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert 'fetch("/status.json"' in script.body.decode()
        style = await fetch(client, admin, "GET", "/static/status.css")
        assert style.headers["content-type"].startswith("text/css")
        # Self-contained: nothing is loaded from anywhere else, and no inline code.
        for text in (html, style.body.decode()):
            assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
            assert "@import" not in text and "url(" not in text
        assert "<style" not in html and "<script>" not in html
        assert not re.search(r"\son[a-z]+=", html)  # no inline event handlers

        head = await fetch(client, admin, "HEAD", "/healthz")
        assert head.status == 200 and head.body == b""
        assert head.headers["content-length"] == "3"

        unchanged = await fetch(client, admin, "POST", "/rules/reload")
        assert unchanged.status == 200
        assert unchanged.json() == {
            "ok": True,
            "outcome": "unchanged",
            "version": rules.version,
            "previous_version": rules.version,
            "source": rules.source,
            "problems": [],
        }


@pytest.mark.parametrize("client", CLIENTS)
async def test_unknown_path_404_and_wrong_method_405(admin: Admin, client: str) -> None:
    with trio.fail_after(TIMEOUT):
        missing = await fetch(client, admin, "GET", "/nope")
        assert missing.status == 404
        assert b"/healthz" in missing.body  # says what does exist
        query = await fetch(client, admin, "GET", "/healthz?verbose=1")
        assert query.status == 200
        post = await fetch(client, admin, "POST", "/healthz")
        assert (post.status, post.headers["allow"]) == (405, "GET, HEAD")
        get_reload = await fetch(client, admin, "GET", "/rules/reload")
        assert (get_reload.status, get_reload.headers["allow"]) == (405, "POST")
        delete = await fetch(client, admin, "DELETE", "/rules")
        assert delete.status == 405
    assert admin.server.reloader.rule_reloads == 0


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


# --------------------------------------------------------------------------- readiness


async def test_readyz_before_discovery_is_503(admin: Admin) -> None:
    admin.server.ready = trio.Event()
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(admin.port, "GET", "/readyz")
    assert answer.status == 503 and b"discovering" in answer.body


async def test_readyz_is_503_when_no_upstream_answers(admin: Admin) -> None:
    port = admin.broker.socket.getsockname()[1]
    await admin.broker.aclose()
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(admin.port, "GET", "/readyz")
        assert answer.status == 503
        assert f"127.0.0.1:{port}".encode() in answer.body  # names what it tried
        # An open broker connection is proof enough, whatever the bootstrap address does.
        admin.server.stats.upstream_connections = 2
        answer = await h11_request(admin.port, "GET", "/readyz")
        assert answer.status == 200 and b"2 broker connections open" in answer.body


# --------------------------------------------------------------------------- status figures


async def test_status_figures(admin: Admin) -> None:
    stats = admin.server.stats
    stats.client_connections = 7
    stats.upstream_connections = 2
    stats.client_requests[ApiKey.PRODUCE] = 90
    stats.upstream_requests[ApiKey.PRODUCE] = 30
    stats.holds = 4
    status = admin.app.status()
    assert status["connections"] == {"client": 7, "upstream": 2}
    produce = status["produce"]
    assert isinstance(produce, dict) and produce["coalescing_ratio"] == 3.0
    assert status["holds"] == {"holds": 4, "hold_retries": 0}


def test_rate_window() -> None:
    stats = Stats()
    window = RateWindow(samples=3)
    assert window.rates(0.0, stats) is None
    stats.client_requests[ApiKey.PRODUCE] = 10
    window.sample(0.0, stats)
    stats.client_requests[ApiKey.PRODUCE] = 30
    stats.upstream_requests[ApiKey.PRODUCE] = 5
    window.sample(1.0, stats)
    stats.client_requests[ApiKey.PRODUCE] = 50
    rates = window.rates(2.0, stats)
    assert rates is not None
    seconds, client, upstream = rates
    assert (seconds, client[ApiKey.PRODUCE], upstream[ApiKey.PRODUCE]) == (2.0, 20.0, 2.5)
    for t in (2.0, 3.0, 4.0):  # the oldest samples fall out of the window
        window.sample(t, stats)
    rates = window.rates(5.0, stats)
    assert rates is not None and rates[1][ApiKey.PRODUCE] == 0.0


# --------------------------------------------------------------------------- reload over HTTP


@pytest.mark.parametrize("client", CLIENTS)
async def test_post_reload_applies_a_valid_file(admin: Admin, client: str) -> None:
    old = admin.server.rules
    admin.rules_path.write_text(RULES_V2)
    with trio.fail_after(TIMEOUT):
        answer = await fetch(client, admin, "POST", "/rules/reload")
        assert answer.status == 200
        result = answer.json()
        assert isinstance(result, dict)
        assert result["outcome"] == "applied" and result["previous_version"] == old.version
        new_version = result["version"]
        assert new_version != old.version
        got = await fetch(client, admin, "GET", "/rules")
        rules = got.json()
        assert isinstance(rules, dict)
        assert rules["version"] == new_version and rules["coalescing"]["linger_ms"] == 7.0
        metrics = parse((await fetch(client, admin, "GET", "/metrics")).body.decode())
    assert metrics.value("kipside_rule_reloads_total") == 1
    assert metrics.value("kipside_rules_info", version=new_version) == 1
    assert len(metrics.matching("kipside_rules_info")) == 1  # the old version is gone
    assert admin.server.rules.coalescing.linger_ms == 7.0


@pytest.mark.parametrize("client", CLIENTS)
async def test_post_reload_rejects_an_invalid_file_and_keeps_the_rules(
    admin: Admin, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = admin.server.rules
    admin.rules_path.write_text(RULES_INVALID)
    path = str(admin.rules_path)
    with trio.fail_after(TIMEOUT):
        answer = await fetch(client, admin, "POST", "/rules/reload")
        assert answer.status == 422
        result = answer.json()
        assert isinstance(result, dict)
        assert result["ok"] is False and result["version"] == old.version
        assert result["problems"] == [
            f"{path}:2: coalescing.lanes: expected an integer between 1 and 64, got 0 (an integer)",
            f"{path}:3: coalescing.bogus: unknown key 'bogus'; allowed keys here are: enabled, "
            "lanes, linger_ms, max_request_bytes, rules",
        ]
        still = (await fetch(client, admin, "GET", "/rules")).json()
        assert isinstance(still, dict) and still["version"] == old.version
        metrics = parse((await fetch(client, admin, "GET", "/metrics")).body.decode())
        status = (await fetch(client, admin, "GET", "/status.json")).json()
    assert admin.server.rules is old
    assert metrics.value("kipside_rule_reload_errors_total") == 1
    assert metrics.value("kipside_rule_reloads_total") == 0
    assert metrics.value("kipside_rules_info", version=old.version) == 1
    assert (
        isinstance(status, dict) and f"{path}:2: coalescing.lanes" in status["rules"]["last_error"]
    )
    assert f"{path}:2: coalescing.lanes" in caplog.text
    assert f"version {old.version} stays in force" in caplog.text


async def test_post_reload_without_a_rule_file_is_409(nursery: trio.Nursery) -> None:
    server = make_server(None, 9)
    server.ready.set()
    app = AdminApp(server, request_deadline=REQUEST_DEADLINE)
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(serve_admin, listener, app)
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(listener.socket.getsockname()[1], "POST", "/rules/reload")
    assert answer.status == 409 and b"--rules FILE" in answer.body
    assert server.reloader.rule_reload_errors == 0


# --------------------------------------------------------------------------- applying rules


async def test_apply_reaches_every_reader_of_the_rules(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V1)
    server = make_server(path, 9)
    coalescer = Coalescer(
        FeatureContext(
            lambda node_id, principal: object(),  # type: ignore[arg-type,return-value]
            server.default_node,
            lambda: server.rules,
            server.stats,
            nursery,
        ),
        server.nodes,
    )
    server.coalescer = coalescer
    existing_lane = coalescer._lane(111, ANONYMOUS, 0)
    assert server.versions.lower_transaction_version is False

    path.write_text(
        "coalescing:\n  lanes: 5\n  linger_ms: 7\n  rules:\n"
        '    - {topic: "audit.*", coalesce: false}\n' + TXN_RULES
    )
    with trio.fail_after(TIMEOUT), caplog.at_level(logging.INFO):
        result = await server.reloader.reload("test")
    assert result.outcome == "applied"
    new = server.rules
    assert new.coalescing.lanes == 5 and new.transactions
    assert coalescer.rules is new.coalescing
    assert existing_lane.rules is new.coalescing  # linger/max bytes of running lanes follow
    assert coalescer._lane(111, ANONYMOUS, 1).rules is new.coalescing
    assert not coalescer.rules.applies("audit.x", "c")
    assert server.versions.lower_transaction_version is True
    assert "coalescing.lanes changed from 2 to 5" in caplog.text
    assert "until kipside restarts" in caplog.text

    path.write_text(RULES_V1)
    with trio.fail_after(TIMEOUT):
        await server.reloader.reload("test")
    assert server.versions.lower_transaction_version is False


async def test_apply_in_one_to_one_mode_never_lowers_transaction_version() -> None:
    server = make_server(None, 9)
    server.config.share_connections = False
    apply_rules(server, parse_rules(TXN_RULES, "<test>"))
    assert server.versions.lower_transaction_version is False


# --------------------------------------------------------------------------- triggers


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V1)
    server = make_server(path, 9)
    yield server, path


@pytest.fixture
def inline_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reloader's stat() and rule parsing run inline instead of in a worker thread, so
    under the autojump clock no virtual time passes while a thread works."""

    async def run_inline(fn: Callable[..., object], *args: object, **_: object) -> object:
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_inline)


POLL = POLL_SECONDS
SETTLED = 2 * POLL + 0.01
"""A change is applied once it has held still for one poll, so within two polls."""


async def test_file_change_reloads(
    watched: tuple[Server, Path],
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
    inline_file_reads: None,
) -> None:
    caplog.set_level(logging.INFO)
    server, path = watched
    reloader = server.reloader
    old = server.rules
    await nursery.start(reloader.run)
    await trio.sleep(5 * POLL)  # looks at an unchanged file neither apply nor count
    assert (reloader.rule_reloads, server.rules) == (0, old)

    path.write_text(RULES_V2)
    await trio.sleep(SETTLED)
    assert server.rules.version != old.version
    assert reloader.rule_reloads == 1 and server.rules.coalescing.linger_ms == 7.0
    assert "rules reloaded (file change)" in caplog.text

    path.write_text(RULES_INVALID)
    await trio.sleep(SETTLED)
    assert reloader.rule_reload_errors == 1
    await trio.sleep(5 * POLL)  # an unchanged broken file is reported once, not every poll
    assert reloader.rule_reload_errors == 1
    assert server.rules.coalescing.linger_ms == 7.0
    assert f"{path}:2: coalescing.lanes" in caplog.text

    path.unlink()
    await trio.sleep(SETTLED)
    assert caplog.text.count("is gone") == 1 and server.rules.coalescing.linger_ms == 7.0
    await trio.sleep(5 * POLL)
    assert caplog.text.count("is gone") == 1  # logged once
    path.write_text(RULES_V1)
    await trio.sleep(SETTLED)
    assert server.rules.version == old.version


async def test_a_post_does_not_make_the_watcher_read_the_file_again(
    watched: tuple[Server, Path],
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    inline_file_reads: None,
) -> None:
    server, path = watched
    reloader = server.reloader
    await nursery.start(reloader.run)
    path.write_text(RULES_INVALID)
    with trio.fail_after(TIMEOUT):
        result = await reloader.reload("POST /rules/reload")
    assert result.outcome == "rejected"
    await trio.sleep(5 * POLL)
    assert reloader.rule_reload_errors == 1


async def test_sighup_reloads(watched: tuple[Server, Path], nursery: trio.Nursery) -> None:
    server, path = watched
    reloader = server.reloader
    reloader.poll_seconds = 3600  # only the signal may trigger this reload
    await nursery.start(reloader.run)
    path.write_text(RULES_V2)
    os.kill(os.getpid(), signal.SIGHUP)
    with trio.fail_after(TIMEOUT):
        while reloader.rule_reloads == 0:  # noqa: ASYNC110 (the reloader has no event to wait on)
            await trio.sleep(0.01)
    assert server.rules.coalescing.linger_ms == 7.0


# --------------------------------------------------------------------------- command line


def test_admin_bare_port_binds_loopback() -> None:
    assert _admin_address("9644") == Address("127.0.0.1", 9644)
    assert _admin_address("0.0.0.0:9644") == Address("0.0.0.0", 9644)
    assert _admin_address("[::1]:9644") == Address("::1", 9644)


def test_rules_check_prints_the_effective_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V2)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    described = json.loads(out)
    assert list(described)[:2] == ["source", "version"]
    assert described == load_rules(path).describe()
    assert f"{path}: OK (version {described['version']})" in err

    path.write_text(RULES_INVALID)
    assert main(["rules", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path}:2: coalescing.lanes" in err and f"{path}:3: coalescing.bogus" in err


async def test_a_loader_bug_is_a_refused_reload(
    watched: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = watched
    old = server.rules

    def broken(path: str) -> RuleSet:
        raise RuntimeError("bug")

    monkeypatch.setattr("kipside.proxy.operations.reload.load_rules", broken)
    with trio.fail_after(TIMEOUT):
        result = await server.reloader.reload("test")
    assert result.outcome == "rejected" and "RuntimeError('bug')" in result.problems[0]
    assert server.rules is old and server.reloader.rule_reload_errors == 1
