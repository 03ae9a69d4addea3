"""`kipside dev` as a user runs it: the embedded broker, kipside in front, and its console.

Each test starts the real command as a subprocess, its output on a pipe or on a pseudo-terminal,
and drives it with a real client (confluent-kafka). What is checked is what the user reads:
where to connect, the status page URL (and that it answers), no span without --trace-console,
one line per span with it, and a live line that is drawn in place on a terminal only.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from testkit.ports import free_port
from testkit.procs import track

REPO = Path(__file__).resolve().parents[2]
KIPSIDE = REPO / ".venv" / "bin" / "kipside"
DEADLINE = 20.0
LIVE = re.compile(
    r"\r(clients (\d+) \| upstream (\d+) \| ([\d.]+|-) req/s \| "
    r"Produce (\d+) in -> (\d+) out \(([\d.]+x|-)\) \| holds (\d+))\x1b\[K"
)
SPAN = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (send|upstream) .* (ok|[A-Z_]+)$")

pytestmark = pytest.mark.integration


class Dev:
    """`kipside dev` on free loopback ports, its output (stdout and stderr) collected."""

    def __init__(self, *args: str, terminal: bool) -> None:
        self.listen, self.admin = free_port(), free_port()
        command = [
            str(KIPSIDE),
            "dev",
            "--listen",
            f"127.0.0.1:{self.listen}",
            "--node-port-base",
            str(free_port() - 111),
            "--admin",
            str(self.admin),
            *args,
        ]
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        if terminal:
            primary, secondary = pty.openpty()
            os.set_blocking(primary, True)
            self.proc = track(
                subprocess.Popen(
                    command,
                    stdin=secondary,
                    stdout=secondary,
                    stderr=secondary,
                    env=_env(),
                    start_new_session=True,
                )
            )
            os.close(secondary)
            fd = primary
        else:
            self.proc = track(
                subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=_env(),
                    start_new_session=True,
                )
            )
            assert self.proc.stdout is not None
            fd = self.proc.stdout.fileno()
        self._reader = threading.Thread(target=self._collect, args=(fd,), daemon=True)
        self._reader.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listen}"

    def output(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode()

    def wait_for(self, pattern: str, timeout: float = DEADLINE, start: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (found := re.compile(pattern).search(self.output(), start)) is None:
            assert self.proc.poll() is None, f"kipside dev exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.output()}"
            time.sleep(0.05)
        return found

    def status(self) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.admin}/status.json", timeout=5) as reply:
            assert reply.status == 200
            value: dict[str, Any] = json.load(reply)
            return value

    def stop(self) -> int:
        """Ctrl-C, as a terminal sends it: SIGINT to the whole process group. Checks that the
        embedded broker went away with kipside; returns kipside's exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(5)
        broker = re.search(r"embedded Tansu broker on 127\.0\.0\.1:(\d+)", self.output())
        assert broker is not None, self.output()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(broker.group(1))), timeout=1).close()
        return code

    def _collect(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: a terminal whose last writer has gone
                data = b""
            if not data:
                return
            with self._lock:
                self._chunks.append(data)


def _env() -> dict[str, str]:
    env = dict(os.environ, TERM="xterm")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return env


@pytest.fixture
def piped() -> Iterator[Dev]:
    dev = Dev(terminal=False)
    yield dev
    if dev.proc.poll() is None:  # the test failed early: stop it the way that stops its broker
        os.killpg(dev.proc.pid, signal.SIGINT)
        try:
            dev.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dev.proc.kill()


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})


def _produce_one_request_each(producer: Producer, topic: str, count: int) -> None:
    """`count` records, each flushed alone, so each is one ProduceRequest. (librdkafka closes
    its connections when the producer is collected.)"""
    for i in range(count):
        producer.produce(topic, value=f"{topic}-{i}".encode(), partition=0)
        assert producer.flush(15) == 0


def test_kipside_dev_says_where_to_connect_and_stays_quiet(piped: Dev) -> None:
    dev = piped
    dev.wait_for(rf"give clients bootstrap\.servers=127\.0\.0\.1:{dev.listen}\n")
    url = dev.wait_for(r"status page (http://\S+/) ").group(1)
    hint = dev.wait_for(r"kipside: traces are off; .*\n").group(0)
    assert "--trace-console" in hint and "OTEL_EXPORTER_OTLP_ENDPOINT" in hint
    assert url == f"http://127.0.0.1:{dev.admin}/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
    started = dev.output()

    _produce_one_request_each(_producer(dev.bootstrap), "dev-quiet", 30)
    producer = Producer({"bootstrap.servers": dev.bootstrap, "enable.idempotence": True})
    values = [f"dev-{i}".encode() for i in range(100)]
    for value in values:
        producer.produce("dev-topic", value=value, partition=0)
    assert producer.flush(15) == 0
    del producer
    consumer = Consumer(
        {"bootstrap.servers": dev.bootstrap, "group.id": "dev-check", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("dev-topic", 0, 0)])
    got: list[bytes] = []
    end = time.monotonic() + 15
    while len(got) < len(values) and time.monotonic() < end:
        got += [m.value() or b"" for m in consumer.consume(100, 0.5) if m.error() is None]
    consumer.close()
    assert got == values
    assert dev.status()["produce"]["client_requests"] >= 31

    assert dev.stop() == 0
    after = dev.output()[len(started) :].splitlines()
    # Over 30 ProduceRequests, a group and a fetch: a few lines about lanes and shutdown only.
    assert len(after) < 12, after
    assert not [line for line in after if SPAN.match(line) or line.strip() == "{"], after
    assert "\r" not in dev.output() and "\x1b" not in dev.output()  # no live line on a pipe
    assert "req/s" not in dev.output()


def test_trace_console_prints_one_line_per_span() -> None:
    dev = Dev("--trace-console", terminal=False)
    try:
        dev.wait_for(r"kipside: traces: one line per span below \(--trace-console\)\n")
        _produce_one_request_each(_producer(dev.bootstrap), "dev-spans", 5)
        produce = dev.status()["produce"]
        dev.wait_for(r"upstream Produce .* ok\n")
    finally:
        assert dev.stop() == 0
    lines = dev.output().splitlines()
    sends = [line for line in lines if " send dev-spans " in line]
    upstream = [line for line in lines if " upstream Produce " in line]
    assert len(sends) == produce["client_requests"] == 5, lines
    assert len(upstream) == produce["upstream_requests"], lines
    assert all(SPAN.match(line) for line in sends + upstream), lines
    request = re.compile(
        r" send dev-spans Produce v\d+ [\d.]+ms client=rdkafka from=127\.0\.0\.1:\d+ "
        r"correlation=\d+ ok$"
    )
    assert all(request.search(line) for line in sends), sends
    assert all(re.search(r" node=111 lane=\d+ .* links=\d+ ok$", line) for line in upstream)
    assert not [line for line in lines if line.strip() in ("{", "}")], "a JSON span was printed"


def test_live_line_is_drawn_in_place_on_a_terminal() -> None:
    dev = Dev(terminal=True)
    try:
        dev.wait_for(r"status page http://")
        first = dev.wait_for(LIVE.pattern)
        assert first.group(5, 6) == ("0", "0")
        producer = _producer(dev.bootstrap)
        _produce_one_request_each(producer, "dev-live", 20)
        status = dev.status()
        in_, out = status["produce"]["client_requests"], status["produce"]["upstream_requests"]
        clients = status["connections"]["client"]
        assert in_ == 20 and 0 < out <= 20 and clients > 0
        # The producer is idle and still connected: the next redraws show what status.json does.
        line = dev.wait_for(
            rf"\rclients {clients} \|[^\r]* Produce 20 in -> {out} out [^\r]*\x1b\[K"
        )
        live = LIVE.match(line.group(0))
        assert live is not None, line.group(0)
        # Redrawn every second: the rate over the window falls once the traffic has stopped.
        later = dev.wait_for(LIVE.pattern, 5, start=line.end())
        assert later.group(1) != live.group(1)
        del producer
    finally:
        assert dev.stop() == 0
    drawn = [m.groups() for m in LIVE.finditer(dev.output())]
    assert any(d[3] not in ("-", "0.0") for d in drawn), "requests/s never rose"
    ratio = drawn[-1][6]
    assert ratio == f"{20 / out:.2f}x"
    # Lines printed while the live line is up are written over it, each on a row of its own.
    assert "\r\x1b[Kkipside: give clients" not in dev.output()  # printed before the line
    log_above = r"\r\x1b\[K\d{4}-\d\d-\d\d [\d:,]+ INFO kipside\.server: received SIGINT\r\n"
    assert re.search(log_above, dev.output()), dev.output()


def test_a_taken_status_page_port_is_one_error_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(KIPSIDE), "dev", "--listen", "127.0.0.1:0", "--admin", str(port)],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            env=_env(),
        )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"kipside: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in done.stderr
