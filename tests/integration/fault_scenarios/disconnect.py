"""Clients that vanish mid-request, before their answer, mid-coalesced-request and mid-hold."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import create_topics
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

from ..fault_kit.audit import acked_of, audit
from ..fault_kit.loads import (
    SequencedProducer,
    TransactionalLoop,
    run_producers,
    value_of,
    wait_until,
)
from ..fault_kit.stack import FaultStack, fault_stack, transaction_rules
from .outcome import Namer, Outcome, producers_told


class WindowedFaultRelay(FaultRelay, MarkerWindowRelay):
    """The fault relay in front of a SIMULATED Apache Kafka coordinator (its marker window)."""

    def __init__(self, window_ms: float) -> None:
        MarkerWindowRelay.__init__(self, window_ms=window_ms)
        self._init_faults()


VICTIM = """
import sys, confluent_kafka as ck
bootstrap, topic, txn = sys.argv[1:4]
p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn,
                 "compression.type": "none", "metadata.recovery.strategy": "none"})
p.init_transactions(30)
p.begin_transaction()
p.produce(topic, f"{txn}.victim|0|0000000".encode(), partition=0)
p.commit_transaction(30)
p.begin_transaction()
p.produce(topic, f"{txn}.victim|0|0000001".encode(), partition=0)
p.flush(30)  # its AddPartitionsToTxn is held by kipside (the window): killed in here
print("not held", flush=True)
"""


def produce_frame(topic: str, partition: int, value: bytes, correlation_id: int) -> bytes:
    """A ProduceRequest v7 (acks=all) of one uncompressed record, as a frame."""
    batch = encode_batch([Record(None, value)], base_timestamp=int(time.time() * 1000))
    partitions = [PartitionBatch(topic, partition, memoryview(batch))]
    body = encode_produce_request(7, acks=-1, timeout_ms=5000, partitions=partitions)
    head = encode_request_header(ApiKey.PRODUCE, 7, correlation_id, "vanishing")
    return build_frame(head, b"".join(bytes(chunk) for chunk in body))


def vanish(sock: socket.socket) -> None:
    """Close with RST, as a killed process's socket with unread data does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclass(frozen=True)
class DisconnectScale:
    partitions: int = 2
    rate: float = 100.0  # the bystander's
    window_ms: float = 1500.0  # the simulated marker window: how long kipside holds the add
    rounds: int = 1  # of the four kinds of vanishing


GAUGES = ("kipside_client_connections", "kipside_in_flight_bytes")


def clients_vanish(work: Path, name: Namer, s: DisconnectScale) -> Outcome:
    """Clients vanish mid-request, before their answer, mid-coalesced-request and mid-hold,
    beside a bystander producer."""
    out = Outcome(
        f"a bystander idempotent confluent-kafka producer ({s.rate:g} msg/s); vanishing raw "
        "clients; a transactional confluent-kafka producer in a subprocess",
        f"x{s.rounds}: half a ProduceRequest then RST / FIN; a whole one then RST; one queued on "
        "a held lane then RST; SIGKILL while kipside holds its AddPartitionsToTxn",
    )
    topic, group = name("gone"), name("g")
    txn_id = name("victim")
    rules = transaction_rules((f"{txn_id}*", topic, group))
    with fault_stack(work, rules, relay=WindowedFaultRelay(s.window_ms)) as stack:
        create_topics(stack.bootstrap, [topic], s.partitions)
        host, port = stack.bootstrap.rsplit(":", 1)
        address = (host, int(port))
        bystander = SequencedProducer("bystander", stack.bootstrap, topic, s.partitions, s.rate)
        bystander.run_timeout = 60 + s.rounds * 15
        bystander.start()
        wait_until(lambda: len(bystander.delivered.acked) >= 20, 20, "the bystander writing")
        successors = []
        for r in range(s.rounds):
            _vanish_once(stack, address, topic, r)
            successors.append(_victim_and_successor(stack, topic, f"{txn_id}-{r}", group, s))
        run_producers([bystander], timeout=120)
        wait_until(
            lambda: all(stack.metrics().value(g) == 0 for g in GAUGES),
            10,
            "kipside's gauges back to zero",
        )
        metrics = stack.metrics()
        log = stack.kipside.log()
        acknowledged = acked_of([bystander]) + [v for x in successors for v in x.committed]
        result = audit(stack.broker.bootstrap, topic, s.partitions, acknowledged)
    out.result = (
        f"{result.line()}; written by the vanished clients {result.unacknowledged_in_log} (each "
        f"at most once); successor transactions {[x.transactions for x in successors]}; gauges "
        f"{[metrics.value(g) for g in GAUGES]}"
    )
    producers_told(out, [bystander])
    twice = f"{result.line()}; duplicated {result.duplicated}"
    out.check("every acknowledged message once, nothing twice", result.clean, twice)
    out.check("each successor committed", all(x.transactions == 3 for x in successors))
    closed = "".join(ln for ln in log.splitlines() if "closing" in ln)
    out.check("kipside never closed the bystander", "'bystander'" not in closed, closed[-500:])
    out.check("no paused client", metrics.value("kipside_paused_client_connections") == 0)
    out.check("kipside logged no error", "ERROR" not in log, log[-3000:])
    return out


def _vanish_once(stack: FaultStack, address: tuple[str, int], topic: str, r: int) -> None:
    frame = produce_frame(topic, 0, value_of(f"raw{r}", 0, 0), 1)
    for close in (vanish, socket.socket.close):  # half a request, then RST / FIN
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(frame[: len(frame) // 2])
        time.sleep(0.05)
        close(sock)
    sock = socket.create_connection(address, timeout=5)  # whole, gone before the answer
    sock.sendall(produce_frame(topic, 1, value_of(f"raw{r}", 1, 0), 1))
    vanish(sock)
    stack.relay.stall()  # queued on a lane behind the bystander's held request, then gone
    wait_until(lambda: stack.relay.link_counts().held_now >= 1, 10, "a request held")
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(produce_frame(topic, 0, value_of(f"raw{r}", 0, 1), 1))
    time.sleep(0.2)  # kipside reads it and queues it on the busy lane
    vanish(sock)
    time.sleep(0.1)
    stack.relay.resume()


def _victim_and_successor(
    stack: FaultStack, topic: str, txn_id: str, group: str, s: DisconnectScale
) -> TransactionalLoop:
    holds = stack.metrics().value("kipside_holds_total")
    victim = procs.track(
        subprocess.Popen(
            [sys.executable, "-c", VICTIM, stack.bootstrap, topic, txn_id],
            stdout=subprocess.PIPE,
            text=True,
        )
    )

    def holding() -> bool:
        return bool(stack.metrics().value("kipside_holds_total") > holds)

    wait_until(lambda: holding() or victim.poll() is not None, 30, "kipside holding the add")
    assert victim.poll() is None, f"the victim ended first: {victim.communicate()}"
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    time.sleep(s.window_ms / 1000)  # kipside's hold ends with the window; the client is gone
    successor = TransactionalLoop(
        txn_id, stack.bootstrap, topic, s.partitions, topic, group, count=3, per_txn=2
    )
    successor.start()
    successor.join(30)
    assert not successor.is_alive() and successor.error is None, repr(successor.error)
    return successor
