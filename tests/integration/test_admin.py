"""The admin endpoint on a real `kipside serve` in front of Tansu: its paths and ports.

- test_every_path_on_the_real_process: each path, 404, 405, malformed HTTP (400), oversized
  headers (431) and body (413), over an h11 client and curl.
- test_a_silent_client_is_cut_off_at_the_deadline: a client that sends nothing gets a 408 at
  the default request deadline.
- test_a_taken_admin_port_is_one_error_line: a taken admin port is one error line, exit 2.
- test_bare_admin_port_binds_loopback: `--admin PORT` listens on 127.0.0.1 only (OS socket
  table).

Rule hot reload under live traffic is test_admin_hot_reload.py; the status page in a browser,
test_admin_status_page.py.

Run: .venv/bin/pytest tests/integration/test_admin.py -q -p no:cacheprovider
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest
from conftest import DIRECT
from testkit.broker import Broker
from testkit.http import status_of
from testkit.kipside import KIPSIDE_BIN, start_kipside
from testkit.metrics import parse

from kipside.proxy.devbroker import free_port
from kipside.proxy.operations.admin import MAX_BODY_BYTES, REQUEST_DEADLINE_SECONDS

from .admin_stack import AdminStack, curl, fetch, h11_request, raw_exchange
from .admin_stack import admin_stack as admin_stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(DIRECT, reason="KIPSIDE_TEST_DIRECT=1: no kipside to ask"),
]


# --------------------------------------------------------------------------- every path


def test_a_silent_client_is_cut_off_at_the_deadline(admin_stack: AdminStack) -> None:
    """A client that never sends anything gets a 408 at the default deadline (once: the HTTP
    client used by the other checks plays no part in it)."""
    started = time.monotonic()
    answer = raw_exchange(admin_stack.admin_port, b"", timeout=REQUEST_DEADLINE_SECONDS + 5)
    elapsed = time.monotonic() - started
    assert status_of(answer) == 408, answer
    assert REQUEST_DEADLINE_SECONDS - 0.5 < elapsed < REQUEST_DEADLINE_SECONDS + 3
    admin_stack.kipside.assert_alive()


@pytest.mark.parametrize("client", ["h11", "curl"])
def test_every_path_on_the_real_process(admin_stack: AdminStack, client: str) -> None:
    port = admin_stack.admin_port
    health = fetch(client, port, "GET", "/healthz")
    assert (health.status, health.body) == (200, b"ok\n")
    ready = fetch(client, port, "GET", "/readyz")
    assert ready.status == 200 and ready.body.startswith(b"ready: "), ready.body
    rules = fetch(client, port, "GET", "/rules").json()
    assert rules["source"] == str(admin_stack.rules_path)
    assert rules["coalescing"]["linger_ms"] == 20.0
    metrics = parse(fetch(client, port, "GET", "/metrics").body.decode())
    assert metrics.value("kipside_rules_info", version=rules["version"], source=rules["source"])
    assert metrics.value("kipside_rule_reloads_total") == 0
    assert metrics.value("kipside_rule_reload_errors_total") == 0
    assert metrics.value("kipside_build_info", version=version("kipside")) == 1
    status = fetch(client, port, "GET", "/status.json").json()
    assert status["rules"]["version"] == rules["version"] and status["ready"] is True
    page = fetch(client, port, "GET", "/")
    assert page.status == 200 and b'id="rules-version"' in page.body
    assert fetch(client, port, "HEAD", "/metrics").body == b""
    reload = fetch(client, port, "POST", "/rules/reload")
    assert (reload.status, reload.json()["outcome"]) == (200, "unchanged")

    assert fetch(client, port, "GET", "/nope").status == 404
    wrong = fetch(client, port, "PUT", "/rules")
    assert (wrong.status, wrong.headers["allow"]) == (405, "GET, HEAD")
    assert fetch(client, port, "GET", "/rules/reload").status == 405
    too_big = fetch(client, port, "POST", "/rules/reload", b"x" * (MAX_BODY_BYTES + 1))
    assert too_big.status == 413
    big_header = "a" * 20_000
    if client == "curl":
        assert curl(f"http://127.0.0.1:{port}/healthz", "-X", "GET /x").status == 400
        assert curl(f"http://127.0.0.1:{port}/", "-H", f"X-Big: {big_header}").status == 431
    else:
        assert status_of(raw_exchange(port, b"NOT HTTP\r\n\r\n")) == 400
        request = f"GET / HTTP/1.1\r\nHost: x\r\nX-Big: {big_header}\r\n\r\n".encode()
        assert status_of(raw_exchange(port, request)) == 431

    assert admin_stack.metrics().value("kipside_rule_reloads_total") == 1
    admin_stack.kipside.assert_alive()


def test_a_taken_admin_port_is_one_error_line(tansu: Broker) -> None:
    """`kipside serve --admin PORT` with PORT taken: exit 2 with one line naming the port,
    before any client could connect (it printed a traceback of trio's nurseries)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--upstream", tansu.bootstrap, "--listen", "127.0.0.1:0"]
        done = subprocess.run(
            [str(KIPSIDE_BIN), *args, "--admin", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"kipside: error: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr and "bootstrap listening" not in done.stdout


def test_bare_admin_port_binds_loopback(tansu: Broker, tmp_path: Path) -> None:
    port = free_port()
    kipside = start_kipside(tansu, tmp_path / "kipside", extra_args=["--admin", str(port)])
    try:
        assert f"kipside: admin listening on http://127.0.0.1:{port}" in (
            kipside.stdout_path.read_text()
        )
        listening = [
            c.laddr
            for c in psutil.Process(kipside.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)]
        assert h11_request(port, "GET", "/healthz").status == 200
        # Without --rules there is nothing to reload; SIGHUP must not end the process.
        assert h11_request(port, "POST", "/rules/reload").status == 409
        kipside.proc.send_signal(signal.SIGHUP)
        assert kipside.wait_for_log(lambda line: "started without --rules FILE" in line)
        kipside.assert_alive()
    finally:
        assert kipside.stop() == 0
