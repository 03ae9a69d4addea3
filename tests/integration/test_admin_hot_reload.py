"""Rule hot reload during live traffic, on a real `kipside serve` in front of Tansu.

- test_hot_reload_during_live_traffic: confluent-kafka producers keep producing while the rule
  file switches coalescing for their topic off (SIGHUP), on (the file change alone), off (POST
  /rules/reload), then becomes invalid (POST and SIGHUP). Upstream Produce requests per client
  Produce request, from /metrics, follow each switch; an invalid file is refused with its
  FILE:LINE problem in the answer and the log and the version stays; no producer sees an error
  or a disconnect, kipside_client_connections never changes, everything is delivered.

Run: .venv/bin/pytest tests/integration/test_admin_hot_reload.py -q -p no:cacheprovider
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import DIRECT, ONE_TO_ONE, fresh_topic

from .admin_stack import AdminStack, coalescing_rules
from .admin_stack import admin_stack as admin_stack
from .clients_confluent import ck_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(DIRECT, reason="KIPSIDE_TEST_DIRECT=1: no kipside to ask"),
]


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
        v1 = _sighup_switches_coalescing_off(stack, watch, v0)
        v2 = _the_file_change_alone_switches_it_on(stack, watch, v1)
        v3 = _post_rules_reload_switches_it_off(stack, watch, v2)
        _an_invalid_file_is_refused_and_the_rules_stay(stack, watch, v3)
    finally:
        producers.stop()
    assert producers.errors == []
    assert producers.delivered == producers.sent > 1000
    assert set(watch.connections) == {connections}, watch.connections
    assert "kipside: error" not in kipside.log()
    kipside.assert_alive()


def _sighup_switches_coalescing_off(stack: AdminStack, watch: Watch, v0: str) -> str:
    """SIGHUP: coalescing off for the topic; the new rules' version."""
    stack.rules_path.write_text(coalescing_rules(linger_ms=20, topic_coalesces=False))
    stack.kipside.proc.send_signal(signal.SIGHUP)
    v1 = stack.wait_for_version(unlike=v0, timeout=3)
    time.sleep(0.3)  # batches queued under the old rules leave within one linger
    _assert_coalescing(watch, on=False, step="after SIGHUP")
    return v1


def _the_file_change_alone_switches_it_on(stack: AdminStack, watch: Watch, v1: str) -> str:
    """The file change alone (no signal, no POST): coalescing back on; the new version."""
    stack.rules_path.write_text(coalescing_rules(linger_ms=15, topic_coalesces=True))
    v2 = stack.wait_for_version(unlike=v1, timeout=6)
    _assert_coalescing(watch, on=True, step="after the file changed")
    return v2


def _post_rules_reload_switches_it_off(stack: AdminStack, watch: Watch, v2: str) -> str:
    """POST /rules/reload: off again; the answer names the old and new versions."""
    stack.rules_path.write_text(coalescing_rules(linger_ms=10, topic_coalesces=False))
    answer = stack.post("/rules/reload")
    assert answer.status == 200, answer.body
    v3: str = answer.json()["version"]
    assert answer.json()["previous_version"] == v2 and v3 != v2
    assert stack.rules_version() == v3
    time.sleep(0.3)
    _assert_coalescing(watch, on=False, step="after POST /rules/reload")
    return v3


def _an_invalid_file_is_refused_and_the_rules_stay(
    stack: AdminStack, watch: Watch, v3: str
) -> None:
    """An invalid file: refused in full, with FILE:LINE, by POST and by SIGHUP (and not
    re-read by the watcher); version v3 and its coalescing stay, each refusal counted."""
    kipside, path = stack.kipside, stack.rules_path
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


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
