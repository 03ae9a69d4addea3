"""What the admin endpoint's tests (tests/test_admin_*.py) share: the endpoint itself, served
in-process on a loopback listener (port 0) in front of a real, unserved Server whose fake
upstream broker is a loopback listener that accepts and closes; and the clients that ask it:
an h11 client, raw bytes where HTTP has to be broken on purpose, and curl (/usr/bin/curl) in a
subprocess, so both a sans-I/O client and a real one see every answer.

A test module takes the endpoint as the `admin` fixture, imported with an explicit re-export
(`from admin_kit import admin as admin`), which ruff reads as used.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
from testkit.http import Answer, Exchange, Request, curl_answer

from kipside.protocol import Address
from kipside.proxy.operations.admin import AdminApp, serve_admin
from kipside.proxy.server import Server, ServerConfig
from kipside.rules import RuleSet, load_rules

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


async def start_admin(tmp_path: Path, nursery: trio.Nursery) -> Admin:
    """The endpoint on a loopback port, its rules read from RULES_V1 in a file of tmp_path."""
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


@pytest.fixture
async def admin(tmp_path: Path, nursery: trio.Nursery) -> Admin:
    """The endpoint (start_admin), served for the length of the test."""
    return await start_admin(tmp_path, nursery)


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
