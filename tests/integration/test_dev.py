"""`kipside dev`: the embedded broker with kipside in front serves real clients."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kipside.proxy.devbroker import free_port

REPO = Path(__file__).resolve().parents[2]
KIPSIDE = REPO / ".venv" / "bin" / "kipside"

pytestmark = pytest.mark.integration


def test_kipside_dev_serves_real_clients(tmp_path: Path) -> None:
    listen = free_port()
    node_port = free_port()
    out = tmp_path / "dev.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [
                str(KIPSIDE),
                "dev",
                "--listen",
                f"127.0.0.1:{listen}",
                "--node-port-base",
                str(node_port - 111),
            ],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 20
        while "kipside: ready" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        text = out.read_text()
        assert f"give clients bootstrap.servers=127.0.0.1:{listen}" in text
        broker = re.search(r"embedded Tansu broker on 127\.0\.0\.1:(\d+)", text)
        assert broker is not None, text

        bootstrap = f"127.0.0.1:{listen}"
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        values = [f"dev-{i}".encode() for i in range(100)]
        for value in values:
            producer.produce("dev-topic", value=value, partition=0)
        assert producer.flush(15) == 0

        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "dev-check", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("dev-topic", 0, 0)])
        got: list[bytes] = []
        end = time.monotonic() + 15
        while len(got) < len(values) and time.monotonic() < end:
            for message in consumer.consume(100, 0.5):
                if message.error() is None:
                    got.append(message.value())
        consumer.close()
        assert got == values
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, out.read_text()
    # The embedded broker went away with kipside.
    port = int(broker.group(1))
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
