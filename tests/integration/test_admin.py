"""The admin endpoint and rule hot reload (issue 5) on a real `kipside serve` in front of Tansu.

- test_every_path_on_the_real_process: each path, 404, 405, malformed HTTP (400), oversized
  headers (431) and body (413), over an h11 client and curl; a silent client is cut off at the
  default request deadline while the rest runs.
- test_bare_admin_port_binds_loopback: `--admin PORT` listens on 127.0.0.1 only (OS socket
  table).
- test_hot_reload_during_live_traffic: confluent-kafka producers keep producing while the rule
  file switches coalescing for their topic off (SIGHUP), on (the file change alone), off (POST
  /rules/reload), then becomes invalid (POST and SIGHUP). Upstream Produce requests per client
  Produce request, from /metrics, follow each switch; an invalid file is refused with its
  FILE:LINE problem in the answer and the log and the version stays; no producer sees an error
  or a disconnect, kipside_client_connections never changes, everything is delivered.
- test_status_page_in_headless_chromium: GET / in headless Chromium: the live figures fill in
  (connection count and rule version as /status.json has them); a screenshot is saved.

Run: .venv/bin/pytest tests/integration/test_admin.py -q -p no:cacheprovider
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import psutil
import pytest
from conftest import DIRECT, KIPSIDE_BIN, ONE_TO_ONE, Kipside, fresh_topic, start_kipside
from testkit.broker import Broker
from testkit.http import Answer, Exchange, Request, curl_answer, status_of
from testkit.metrics import Metrics, parse

from kipside.proxy.devbroker import free_port
from kipside.proxy.operations.admin import MAX_BODY_BYTES, REQUEST_DEADLINE_SECONDS

from .clients import ck_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(DIRECT, reason="KIPSIDE_TEST_DIRECT=1: no kipside to ask"),
]

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


# --------------------------------------------------------------------------- live reload


@dataclass
class Producers:
    """confluent-kafka producers in threads, each writing small messages to its own partition
    as fast as one every few milliseconds, until stopped."""

    bootstrap: str
    topic: str
    count: int
    sent: int = 0
    delivered: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(f"delivery: {err}")
            else:
                self.delivered += 1

    def _on_error(self, err: Any) -> None:
        with self._lock:
            self.errors.append(f"client error: {err}")  # includes every disconnect

    def _run(self, partition: int) -> None:
        producer = ck.Producer(
            ck_config(
                self.bootstrap,
                **{
                    "client.id": f"reload-{partition}",
                    "linger.ms": 0,
                    "acks": "all",
                    "enable.idempotence": True,
                    "message.timeout.ms": 30000,
                    "error_cb": self._on_error,
                },
            )
        )
        n = 0
        while not self._stop.is_set():
            producer.produce(
                self.topic,
                f"{partition}-{n}".encode(),
                partition=partition,
                on_delivery=self._on_delivery,
            )
            with self._lock:
                self.sent += 1
            n += 1
            producer.poll(0.004)
        remaining = producer.flush(30)
        if remaining:
            with self._lock:
                self.errors.append(f"producer {partition}: {remaining} not delivered")

    def start(self) -> None:
        for partition in range(self.count):
            thread = threading.Thread(target=self._run, args=(partition,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)
            assert not thread.is_alive(), "a producer did not finish flushing"


@dataclass
class Watch:
    """Reads /metrics; remembers every client connection count it saw."""

    stack: AdminStack
    connections: list[float] = field(default_factory=list)

    def produce_counts(self) -> tuple[float, float]:
        metrics = self.stack.metrics()
        self.connections.append(metrics.value("kipside_client_connections"))
        return (
            metrics.value("kipside_client_requests_total", api="Produce"),
            metrics.value("kipside_upstream_requests_total", api="Produce"),
        )

    def ratio_over(self, seconds: float) -> tuple[float, float, float]:
        """(upstream per client Produce request, client delta, upstream delta) over a window."""
        client0, upstream0 = self.produce_counts()
        time.sleep(seconds)
        client1, upstream1 = self.produce_counts()
        client, upstream = client1 - client0, upstream1 - upstream0
        assert client > 100, f"too little traffic to judge: {client} client Produce requests"
        return upstream / client, client, upstream


def _assert_coalescing(watch: Watch, on: bool, step: str) -> None:
    ratio, client, upstream = watch.ratio_over(2.0)
    detail = f"{step}: {upstream:g} upstream for {client:g} client Produce requests"
    print(detail)
    if on:
        assert ratio < 0.7, detail
    else:
        assert client - 2 <= upstream <= client, detail  # one upstream request per client one


@pytest.mark.skipif(ONE_TO_ONE, reason="--one-to-one has no coalescing to switch")
def test_hot_reload_during_live_traffic(
    admin_stack: AdminStack, request: pytest.FixtureRequest
) -> None:
    stack = admin_stack
    kipside = stack.kipside
    path = stack.rules_path
    topic = fresh_topic(kipside.bootstrap, "reload", 6, request)
    producers = Producers(kipside.bootstrap, topic, count=6)
    watch = Watch(stack)
    producers.start()
    try:
        _wait_for(lambda: producers.delivered > 200, "producers to get going")
        time.sleep(0.5)
        connections = stack.metrics().value("kipside_client_connections")
        v0 = stack.rules_version()
        _assert_coalescing(watch, on=True, step="initial rules")

        # SIGHUP: coalescing off for the topic.
        path.write_text(coalescing_rules(linger_ms=20, topic_coalesces=False))
        kipside.proc.send_signal(signal.SIGHUP)
        v1 = stack.wait_for_version(unlike=v0, timeout=3)
        time.sleep(0.3)  # batches queued under the old rules leave within one linger
        _assert_coalescing(watch, on=False, step="after SIGHUP")

        # The file change alone: coalescing back on.
        path.write_text(coalescing_rules(linger_ms=15, topic_coalesces=True))
        v2 = stack.wait_for_version(unlike=v1, timeout=6)
        _assert_coalescing(watch, on=True, step="after the file changed")

        # POST /rules/reload: off again.
        path.write_text(coalescing_rules(linger_ms=10, topic_coalesces=False))
        answer = stack.post("/rules/reload")
        assert answer.status == 200, answer.body
        v3 = answer.json()["version"]
        assert answer.json()["previous_version"] == v2 and v3 != v2
        assert stack.rules_version() == v3
        time.sleep(0.3)
        _assert_coalescing(watch, on=False, step="after POST /rules/reload")

        # An invalid file: refused in full, with FILE:LINE, and the rules stay.
        mark = kipside.log_mark()
        invalid = coalescing_rules(linger_ms=10, topic_coalesces=True)
        path.write_text(invalid.replace("lanes: 1", "lanes: 0"))
        answer = stack.post("/rules/reload")
        assert answer.status == 422, answer.body
        problem = f"{path}:2: coalescing.lanes: expected an integer between 1 and 64, got 0"
        assert answer.json()["problems"] == [f"{problem} (an integer)"]
        assert kipside.wait_for_log(lambda line: problem in line, mark)
        kipside.proc.send_signal(signal.SIGHUP)
        assert kipside.wait_for_log(lambda line: "rule reload (SIGHUP) rejected" in line, mark)
        time.sleep(2.5)  # the watcher has seen the file: a file already refused is not re-read
        assert stack.rules_version() == v3
        metrics = stack.metrics()
        assert metrics.value("kipside_rule_reloads_total") == 3
        assert metrics.value("kipside_rule_reload_errors_total") == 2
        assert stack.get("/status.json").json()["rules"]["last_error"].startswith(f"{path}:")
        _assert_coalescing(watch, on=False, step="after the invalid file (v3 stays)")
    finally:
        producers.stop()
    assert producers.errors == []
    assert producers.delivered == producers.sent > 1000
    assert set(watch.connections) == {connections}, watch.connections
    assert "kipside: error" not in kipside.log()
    kipside.assert_alive()


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --------------------------------------------------------------------------- status page

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "headless Chromium is not installed (Debian package `chromium`): run `make system-deps` "
        "or `apt-get install -y chromium` to run the status page test"
    )


def _run_chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_status_page_in_headless_chromium(
    admin_stack: AdminStack, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    chromium = _chromium()
    stack = admin_stack
    topic = fresh_topic(stack.kipside.bootstrap, "status", 2, request)
    producer = ck.Producer(ck_config(stack.kipside.bootstrap, **{"linger.ms": 0}))
    try:
        for i in range(50):
            producer.produce(topic, f"m{i}".encode(), partition=i % 2)
            producer.poll(0)
        assert producer.flush(15) == 0
        status = stack.get("/status.json").json()
        connections = status["connections"]["client"]
        version = status["rules"]["version"]
        assert connections >= 1  # the idle producer stays connected while the page loads
        url = f"http://127.0.0.1:{stack.admin_port}/"

        # Virtual time runs the page's 1 s refresh a few times, then the DOM is printed.
        dom = _run_chromium(chromium, tmp_path, "--virtual-time-budget=4000", "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        updates = re.search(r'<body data-updates="(\d+)"', html)
        assert updates and int(updates.group(1)) >= 2, html[:500]
        assert '<span id="state" class="live">live</span>' in html
        assert f'id="client-connections">{connections}</div>' in html
        assert f'id="rules-version">{version}</div>' in html
        assert re.search(r"<td>Produce</td><td>[\d.]+</td>", html), html

        screenshot = tmp_path / "status-page.png"
        shot = _run_chromium(
            chromium,
            tmp_path,
            "--virtual-time-budget=3000",
            "--window-size=1100,760",
            "--hide-scrollbars",
            f"--screenshot={screenshot}",
            url,
        )
        assert shot.returncode == 0, shot.stderr[-2000:]
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert screenshot.stat().st_size > 10_000
        print(f"status page screenshot: {screenshot}")
    finally:
        producer.flush(5)
