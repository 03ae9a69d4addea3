"""What the admin endpoint's integration tests (test_admin*.py here) share: a real `kipside
serve --admin` in front of Tansu with a rule file (the `admin_stack` fixture), and the HTTP
clients that ask it: an h11 client, raw bytes where HTTP has to be broken on purpose, and curl
in a subprocess.

A test module takes the stack as the `admin_stack` fixture, imported with an explicit
re-export (`from .admin_stack import admin_stack as admin_stack`), which ruff reads as used.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from testkit.broker import Broker
from testkit.http import Answer, Exchange, Request, curl_answer
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import Metrics, parse

from kipside.proxy.devbroker import free_port

CURL = shutil.which("curl") or "/usr/bin/curl"
HTTP_TIMEOUT = 10.0


# --------------------------------------------------------------------------- HTTP clients


def h11_request(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
) -> Answer:
    exchange = Exchange(Request(port, method, path, body, headers))
    with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT) as sock:
        # The server may answer early (413) and close; the answer is still readable.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(exchange.request)
        while (answer := exchange.receive(sock.recv(65536))) is None:
            pass
        return answer


def raw_exchange(port: int, data: bytes, timeout: float = HTTP_TIMEOUT) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
        return bytes(received)


def curl(url: str, *args: str) -> Answer:
    proc = subprocess.run(
        [CURL, "-s", "-i", "--max-time", str(HTTP_TIMEOUT), *args, url],
        capture_output=True,
        timeout=HTTP_TIMEOUT + 5,
        check=False,
    )
    answer = curl_answer(proc.stdout)
    assert answer is not None, f"curl {args} {url}: exit {proc.returncode}, {proc.stderr!r}"
    return answer


def fetch(client: str, port: int, method: str, path: str, body: bytes = b"") -> Answer:
    if client == "h11":
        return h11_request(port, method, path, body)
    args = ["-I"] if method == "HEAD" else ["-X", method]
    if body:
        with tempfile.NamedTemporaryFile(suffix=".body") as f:
            f.write(body)
            f.flush()
            return curl(f"http://127.0.0.1:{port}{path}", *args, "--data-binary", f"@{f.name}")
    return curl(f"http://127.0.0.1:{port}{path}", *args)


# --------------------------------------------------------------------------- kipside


@dataclass
class AdminStack:
    kipside: Kipside
    admin_port: int
    rules_path: Path

    def get(self, path: str) -> Answer:
        return h11_request(self.admin_port, "GET", path)

    def post(self, path: str) -> Answer:
        return h11_request(self.admin_port, "POST", path)

    def metrics(self) -> Metrics:
        return parse(self.get("/metrics").body.decode())

    def rules_version(self) -> str:
        return str(self.get("/rules").json()["version"])

    def wait_for_version(self, unlike: str, timeout: float = 6.0) -> str:
        deadline = time.monotonic() + timeout
        while (version := self.rules_version()) == unlike:
            assert time.monotonic() < deadline, f"rules still at version {unlike}"
            time.sleep(0.1)
        return version


@pytest.fixture
def admin_stack(tansu: Broker, tmp_path: Path) -> Iterator[AdminStack]:
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(coalescing_rules(linger_ms=20, topic_coalesces=True))
    port = free_port()
    kipside = start_kipside(
        tansu, tmp_path / "kipside", rules=rules_path, extra_args=["--admin", f"127.0.0.1:{port}"]
    )
    try:
        assert f"kipside: admin listening on http://127.0.0.1:{port}" in (
            kipside.stdout_path.read_text()
        )
        yield AdminStack(kipside, port, rules_path)
    finally:
        assert kipside.stop() == 0, kipside.log()[-3000:]


def coalescing_rules(linger_ms: int, topic_coalesces: bool, topic: str = "reload-*") -> str:
    return (
        "coalescing:\n"
        "  lanes: 1\n"
        f"  linger_ms: {linger_ms}\n"
        "  rules:\n"
        f'    - {{topic: "{topic}", coalesce: {str(topic_coalesces).lower()}}}\n'
    )
