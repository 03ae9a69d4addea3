"""Clients that vanish mid-request, mid-coalesced-request and mid-hold, while a bystander (an
idempotent confluent-kafka producer) writes through the same kipside and the same lanes.

In one run, through kipside -> a FaultRelay that also simulates Apache Kafka's marker-writing
window after EndTxn (tests/txn_relay.py's MarkerWindowRelay, so kipside's transaction-begin
hold has something to hold) -> Tansu:

1. mid-request: raw sockets send half a ProduceRequest and reset or close;
2. gone before the answer: a raw socket sends a whole ProduceRequest and resets at once;
3. mid-coalesced-request: the relay holds the lanes' requests, so a raw client's batch queues
   on a lane behind the bystander's; the raw client resets, then the relay lets go;
4. mid-hold: a confluent-kafka transactional producer in a subprocess commits (the simulated
   window opens), begins the next transaction, and is SIGKILLed while kipside holds its
   AddPartitionsToTxn; then a successor with the same transactional.id must work.

Afterwards: the bystander lost nothing, wrote nothing twice, and kipside never closed its
connection; the relay read only whole, readable requests; what the vanished clients sent is
in the log at most once; the successor's transaction committed; and kipside's gauges are back
to zero once everyone has left (client connections, bytes in flight, paused connections).

Run: .venv/bin/pytest tests/integration/test_faults_disconnect.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import create_topics, skip_unless_shared_lanes, unique_name
from relaykit.faults import FaultRelay
from testkit import procs
from txn_relay import MarkerWindowRelay

from kipside.protocol import (
    ApiKey,
    PartitionBatch,
    Record,
    build_frame,
    encode_batch,
    encode_produce_request,
    encode_request_header,
)

from .fault_kit import (
    SequencedProducer,
    TransactionalLoop,
    acked_of,
    audit,
    fault_stack,
    run_producers,
    transaction_rules,
    value_of,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
WINDOW_MS = 1500.0  # the simulated marker window: how long kipside holds the next add
GAUGES = ("kipside_client_connections", "kipside_in_flight_bytes")

VICTIM = """
import sys, confluent_kafka as ck
bootstrap, topic, txn = sys.argv[1:4]
p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn,
                 "compression.type": "none", "metadata.recovery.strategy": "none"})
p.init_transactions(30)
p.begin_transaction()
p.produce(topic, b"victim|0|0000000", partition=0)
p.commit_transaction(30)
p.begin_transaction()
p.produce(topic, b"victim|0|0000001", partition=0)
p.flush(30)  # its AddPartitionsToTxn is held by kipside (the window): killed in here
print("not held", flush=True)
"""


@pytest.fixture(autouse=True)
def _needs_lanes() -> None:
    skip_unless_shared_lanes("the shared lanes")


class WindowedFaultRelay(FaultRelay, MarkerWindowRelay):
    """The fault relay in front of a SIMULATED Apache Kafka coordinator (its marker window)."""

    def __init__(self, window_ms: float) -> None:
        MarkerWindowRelay.__init__(self, window_ms=window_ms)
        self._init_faults()


def produce_frame(topic: str, partition: int, value: bytes, correlation_id: int) -> bytes:
    """A ProduceRequest v7 (acks=all) of one uncompressed record, as a frame."""
    batch = encode_batch([Record(None, value)], base_timestamp=int(time.time() * 1000))
    body = encode_produce_request(
        7,
        acks=-1,
        timeout_ms=5000,
        partitions=[PartitionBatch(topic, partition, memoryview(batch))],
    )
    head = encode_request_header(ApiKey.PRODUCE, 7, correlation_id, "vanishing")
    return build_frame(head, b"".join(bytes(chunk) for chunk in body))


def vanish(sock: socket.socket) -> None:
    """Close with RST, as a killed process's socket with unread data does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_clients_vanish_mid_request_mid_coalesced_request_and_mid_hold(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic, group = unique_name("gone", request), unique_name("g", request)
    txn_id = unique_name("victim", request)
    rules = transaction_rules((f"{txn_id}*", topic, group))
    relay = WindowedFaultRelay(WINDOW_MS)
    with fault_stack(tmp_path, rules, relay=relay) as stack:
        create_topics(stack.bootstrap, [topic], PARTITIONS)
        host, port = stack.bootstrap.rsplit(":", 1)
        address = (host, int(port))
        bystander = SequencedProducer("bystander", stack.bootstrap, topic, PARTITIONS, 100.0)
        bystander.start()
        wait_until(lambda: len(bystander.delivered.acked) >= 20, 20, "the bystander writing")
        frame = produce_frame(topic, 0, value_of("raw", 0, 0), 1)

        # 1. Half a request, then a reset; half a request, then a clean close.
        for close in (vanish, socket.socket.close):
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(frame[: len(frame) // 2])
            time.sleep(0.05)
            close(sock)
        # 2. A whole request, and gone before the answer.
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(produce_frame(topic, 1, value_of("raw", 1, 0), 1))
        vanish(sock)
        # 3. Queued on a lane behind the bystander's held request, then gone.
        stack.relay.stall()
        wait_until(lambda: stack.relay.link_counts().held_now >= 1, 10, "a request held")
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(produce_frame(topic, 0, value_of("raw", 0, 1), 1))
        time.sleep(0.2)  # kipside reads it and queues it on the busy lane
        vanish(sock)
        time.sleep(0.1)
        stack.relay.resume()

        # 4. Killed while kipside holds its AddPartitionsToTxn through the window.
        holds = stack.metrics().value("kipside_holds_total")
        victim = procs.track(
            subprocess.Popen(
                [sys.executable, "-c", VICTIM, stack.bootstrap, topic, txn_id],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        wait_until(
            lambda: (
                stack.metrics().value("kipside_holds_total") > holds or victim.poll() is not None
            ),
            30,
            "kipside holding the victim's add",
        )
        assert victim.poll() is None, f"the victim ended first: {victim.communicate()}"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        time.sleep(WINDOW_MS / 1000)  # kipside's hold ends with the window; the client is gone
        successor = TransactionalLoop(
            txn_id, stack.bootstrap, topic, PARTITIONS, topic, group, count=3, per_txn=2
        )
        successor.start()
        successor.join(30)
        assert not successor.is_alive() and successor.error is None, repr(successor.error)

        run_producers([bystander])
        wait_until(
            lambda: all(stack.metrics().value(g) == 0 for g in GAUGES),
            10,
            "kipside's gauges back to zero",
        )
        metrics = stack.metrics()
        log = stack.kipside.log()
        acknowledged = acked_of([bystander]) + successor.committed
        result = audit(stack.direct, topic, PARTITIONS, acknowledged)
    print(
        f"\nfour kinds of vanishing clients beside a bystander: {result.line()}; written by the "
        f"vanished clients {result.unacknowledged_in_log}; holds "
        f"{metrics.value('kipside_holds_total'):.0f}; successor transactions "
        f"{successor.transactions}; gauges {[metrics.value(g) for g in GAUGES]}"
    )
    assert not bystander.delivered.failed, bystander.delivered.failed[:3]
    result.assert_clean()
    assert successor.transactions == 3
    assert "'bystander'" not in "".join(ln for ln in log.splitlines() if "closing" in ln)
    assert metrics.value("kipside_paused_client_connections") == 0
    assert "ERROR" not in log, log[-3000:]
