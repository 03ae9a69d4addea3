"""Bytes that are not Kafka (garbage, a TLS ClientHello, an HTTP request) on kipside's
bootstrap and node ports: the connection is closed, one log line says what arrived, and a
client producing at the same time is unaffected.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time

import confluent_kafka as ck
import pytest
from conftest import NewTopicFactory
from testkit.kipside import Kipside

from .clients import Msg, assert_exactly_once_in_order
from .clients_confluent import Deliveries, ck_config
from .clients_read_back import consume_assigned

pytestmark = pytest.mark.integration


def _tls_client_hello() -> bytes:
    """The exact bytes a TLS client sends first (a real ClientHello from Python's ssl)."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="kipside.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[0] == 0x16, hello[:8]  # handshake record
    return hello


NOT_KAFKA: dict[str, tuple[bytes, re.Pattern[str]]] = {
    "garbage": (
        bytes.fromhex("deadbeef") + bytes(range(7, 250, 3)),  # negative frame size, then noise
        re.compile(r"garbage|invalid|malformed|not (a )?kafka|unexpected|bad|frame|size", re.I),
    ),
    "tls": (_tls_client_hello(), re.compile(r"\bTLS\b|\bSSL\b", re.I)),
    "http": (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.0\r\n\r\n",
        re.compile(r"\bHTTP\b", re.I),
    ),
}


def _send_and_expect_close(
    host: str, port: int, payload: bytes, timeout: float = 5.0
) -> tuple[int, bytes]:
    """Send payload on a fresh connection and wait for kipside to close it.

    Returns our local port (to find kipside's log line about this connection) and whatever
    kipside sent back before closing.
    """
    with socket.create_connection((host, port), timeout=timeout) as s:
        local_port: int = s.getsockname()[1]
        s.sendall(payload)
        received = b""
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"kipside kept the connection open after {payload[:16]!r}")
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return local_port, received
            except TimeoutError as exc:
                raise AssertionError(
                    f"kipside kept the connection open {timeout} s after {payload[:16]!r}"
                ) from exc
            if not chunk:
                return local_port, received
            received += chunk


class BackgroundProducer(threading.Thread):
    """A confluent-kafka producer sending continuously until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="background-producer", daemon=True)
        self.topic, self.partitions = topic, partitions
        self.producer = ck.Producer(ck_config(bootstrap, **{"linger.ms": 2}))
        self.stop_event = threading.Event()
        self.sent: list[Msg] = []
        self.reports = Deliveries()
        self.undelivered = -1

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            m = Msg(i % self.partitions, None, f"bg-{i:06d}".encode())
            self.producer.produce(
                self.topic, m.value, partition=m.partition, on_delivery=self.reports.on_delivery
            )
            self.sent.append(m)
            self.producer.poll(0.002)
            i += 1
        self.undelivered = self.producer.flush(15)


@pytest.mark.parametrize("kind", list(NOT_KAFKA))
def test_not_kafka_bytes_are_rejected(
    kind: str, kipside: Kipside, bootstrap: str, new_topic: NewTopicFactory
) -> None:
    """Garbage / a TLS ClientHello / an HTTP request on the bootstrap and on a node port: the
    connection is closed, the log says what arrived (TLS / HTTP), and a confluent-kafka client
    producing at the same time is unaffected."""
    payload, says = NOT_KAFKA[kind]
    topic = new_topic(2)
    bg = BackgroundProducer(bootstrap, topic, 2)
    bg.start()
    try:
        deadline = time.monotonic() + 15
        while bg.reports.acked < 50:
            assert time.monotonic() < deadline, f"producer stuck: {bg.reports.errors[:3]}"
            time.sleep(0.02)
        node_port = next(iter(kipside.node_ports.values()))
        for port in (kipside.port, node_port):
            mark = kipside.log_mark()
            peer, _reply = _send_and_expect_close(kipside.host, port, payload)
            # kipside logs the client's address; find the lines about this connection.
            mine = re.compile(rf"127\.0\.0\.1:{peer}\b")
            kipside.wait_for_log(mine.search, mark, timeout=5)
            time.sleep(0.2)  # then count: one line, not one line per frame or per retry
            lines = [ln for ln in kipside.log_since(mark).splitlines() if mine.search(ln)]
            assert len(lines) == 1 and says.search(lines[0]), (
                f"expected one log line about {kind} from port {peer} on kipside port {port} "
                f"matching {says.pattern!r}; new log:\n" + kipside.log_since(mark)
            )
            assert "Traceback" not in kipside.log_since(mark), kipside.log_since(mark)
        kipside.assert_alive()
        before = bg.reports.acked
        deadline = time.monotonic() + 10
        while bg.reports.acked < before + 50:  # still producing after the rejected connections
            assert time.monotonic() < deadline, f"producer stalled: {bg.reports.errors[:3]}"
            time.sleep(0.02)
    finally:
        bg.stop_event.set()
        bg.join(30)
    assert not bg.is_alive(), "background producer did not finish flushing"
    assert bg.undelivered == 0 and not bg.reports.errors, (bg.undelivered, bg.reports.errors[:3])
    got, marks = consume_assigned(bootstrap, bg.topic, 2, len(bg.sent))
    assert_exactly_once_in_order(bg.sent, got, marks)
