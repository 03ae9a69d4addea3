"""Which connections real clients get through kipside: a request the broker parks (a
JoinGroup, a long-poll Fetch) never stalls another client's produce, and every TCP connection
a client opens goes to kipside's bootstrap or node ports, none to the broker.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import confluent_kafka as ck
import psutil
import pytest
from conftest import NewTopicFactory, unique_name
from testkit.kipside import Kipside

from .clients import CLIENTS, call_with_deadline, make_messages
from .clients_confluent import ck_config, ck_consumer
from .clients_kafka_python import kp_producer, kp_send

pytestmark = pytest.mark.integration

# --------------------------------------------------------------------------- parked requests


def test_parked_requests_do_not_stall_other_clients(
    bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """A JoinGroup that the broker parks (Tansu holds the first join ~3 s) and long-poll Fetches
    on an empty topic must not delay another client's produce: a proxy that shared one
    upstream connection for them would add seconds (the broker answers a connection's
    requests one at a time)."""
    topic, idle = new_topic(2), new_topic(1, prefix="idle")
    latencies: list[tuple[float, float]] = []  # (start time, seconds)
    errors: list[str] = []
    stop = threading.Event()

    def produce_one_at_a_time() -> None:
        p = ck.Producer(ck_config(bootstrap, **{"linger.ms": 0, "acks": "all"}))
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            p.produce(topic, f"lat-{i}".encode(), partition=i % 2)
            if p.flush(10) != 0:
                errors.append(f"message {i} not delivered in 10 s")
                return
            latencies.append((t0, time.monotonic() - t0))
            i += 1
            stop.wait(0.002)

    producer = threading.Thread(target=produce_one_at_a_time, daemon=True)
    producer.start()
    joiner = ck_consumer(bootstrap, unique_name("g"))
    poller = ck_consumer(bootstrap, unique_name("g"), **{"fetch.wait.max.ms": 2000})
    try:
        deadline = time.monotonic() + 10
        while len(latencies) < 20:
            assert time.monotonic() < deadline and not errors, f"producer stuck: {errors}"
            time.sleep(0.01)
        poller.assign([ck.TopicPartition(idle, 0, ck.OFFSET_BEGINNING)])
        join_start = time.monotonic()
        joiner.subscribe([topic])
        deadline = time.monotonic() + 20
        while not joiner.assignment():
            assert time.monotonic() < deadline, "consumer never joined the group"
            joiner.poll(0.05)
            poller.poll(0)
        join_end = time.monotonic()
        time.sleep(0.3)
    finally:
        stop.set()
        producer.join(15)
        call_with_deadline(joiner.close, 15, "joiner close")
        call_with_deadline(poller.close, 15, "poller close")
    assert not errors, errors
    during = [lat for t0, lat in latencies if join_start <= t0 <= join_end]
    assert len(during) >= 5, (
        f"only {len(during)} produces while joining ({join_end - join_start:.1f} s)"
    )
    assert max(during) < 1.0, (
        f"produce took up to {max(during):.2f} s while another client's JoinGroup was parked "
        f"({join_end - join_start:.1f} s join; {len(during)} produces, median "
        f"{sorted(during)[len(during) // 2] * 1000:.1f} ms)"
    )


# --------------------------------------------------------------------------- socket table


def _remote_tcp(pid: int) -> list[tuple[str, int]]:
    return [
        (c.raddr.ip, c.raddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.status == psutil.CONN_ESTABLISHED
    ]


def _assert_only_kipside(conns: list[tuple[str, int]], kipside: Kipside, who: str) -> None:
    local = [c for c in conns if c[0] in ("127.0.0.1", "::ffff:127.0.0.1")]
    assert local, f"{who} has no TCP connection to 127.0.0.1 at all: {conns}"
    upstream = int(kipside.upstream.rsplit(":", 1)[1])
    direct = [c for c in conns if c[1] == upstream]
    assert not direct, f"{who} dialled the broker directly: {direct}"
    strays = [c for c in local if c[1] not in kipside.ports]
    assert not strays, f"{who} connected to non-kipside ports {strays}; kipside: {kipside.ports}"
    assert any(c[1] in kipside.node_ports.values() for c in local), (
        f"{who} never reached a per-node listener {kipside.node_ports}: {local}"
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_socket_table_subprocess(
    client: str, kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """A client in a child process, connected and consuming: every one of its TCP connections
    goes to kipside's bootstrap or node ports, none to the broker."""
    topic = new_topic(2)
    script = Path(__file__).with_name("socket_client.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), client, bootstrap, topic, unique_name("g"), "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = call_with_deadline(proc.stdout.readline, 45, f"{client} child READY line")
        assert line.startswith(b"READY"), (line, proc.stderr.read() if proc.stderr else b"")
        assert line.split()[1] == b"20", f"child consumed {line!r}"
        _assert_only_kipside(_remote_tcp(proc.pid), kipside, f"{client} child process")
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_socket_table_in_process(
    kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """Same check on this (pytest) process while kafka-python and confluent-kafka clients are
    connected. Topics are created through kipside, so no harness socket goes to the broker."""
    topic = new_topic(2)
    msgs = make_messages(20, 2)
    producer = kp_producer(bootstrap)
    consumer = ck_consumer(bootstrap, unique_name("g"))
    try:
        futures = kp_send(producer, topic, msgs)
        producer.flush(timeout=15)
        for f in futures:
            f.get(timeout=1)
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < len(msgs):
            assert time.monotonic() < deadline, f"consumed {got}/{len(msgs)}"
            m = consumer.poll(0.1)
            if m is not None and not m.error():
                got += 1
        _assert_only_kipside(_remote_tcp(psutil.Process().pid), kipside, "the pytest process")
    finally:
        producer.close(timeout=5)
        call_with_deadline(consumer.close, 15, "consumer close")
