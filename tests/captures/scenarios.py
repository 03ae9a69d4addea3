"""Real Kafka traffic through kipside, captured on both sides with tcpdump: the coalescing run and
the transaction run that test_captured_runs.py checks, that capture_run.py turns into the golden
files and that docs/evidence.md shows.

A run: Tansu behind a test relay that counts, independently of kipside and of the captures,
what kipside sends upstream (CountingRelay for coalescing; MarkerWindowRelay, Apache Kafka's
marker-writing window after EndTxn simulated, for transactions); kipside in front of the relay;
tcpdump on the relay's port (the broker side, started before kipside so its discovery is in it)
and on kipside's ports (the client side, started before any client connects). The clients are
confluent-kafka. Clients, kipside (SIGTERM) and both tcpdumps have stopped before the relay's
counts are read, so the broker-side capture and the relay saw the same traffic, and the run's
`expected` figures are the relay's, never the summary's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from conftest import create_topics
from relaykit.tansu import tansu_behind
from relays import CountingRelay
from testkit.broker import Broker
from testkit.capture import Tcpdump
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import scrape
from testkit.ports import free_port
from txn_relay import ADD_OFFSETS, ADD_PARTITIONS, END_TXN, MarkerWindowRelay

from kipside.protocol import ApiKey, api_name

CLIENT_PCAP = "client.pcap"
BROKER_PCAP = "broker.pcap"
RUN_JSON = "run.json"
CALL_TIMEOUT = 15.0


@dataclass
class Run:
    """Where a run's captures are, and what the relay (and kipside) counted while it ran."""

    scenario: str
    kipside_ports: list[int]
    broker_port: int
    dropped: dict[str, int]
    """Packets the kernel dropped per capture (a test requires none)."""
    relay: dict[str, Any]
    """The relay's counts: requests per API, connections, batches, records (and transactions)."""
    kipside: dict[str, Any]
    """kipside's own /metrics: client requests per API."""
    settings: dict[str, Any] = field(default_factory=dict)

    def save(self, workdir: Path) -> None:
        (workdir / RUN_JSON).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, workdir: Path) -> Run:
        return cls(**json.loads((workdir / RUN_JSON).read_text()))


def _names(counts: Counter[int]) -> dict[str, int]:
    return {api_name(key): n for key, n in sorted(counts.items()) if n}


def _client_requests(admin_port: int) -> dict[str, int]:
    metrics = scrape(admin_port)
    out = {}
    for key in ApiKey:
        value = metrics.value("kipside_client_requests_total", 0.0, api=api_name(key))
        if value:
            out[api_name(key)] = int(value)
    return out


@contextlib.contextmanager
def _kipside(tansu: Broker, port: int, workdir: Path, rules: str) -> Iterator[tuple[Kipside, int]]:
    rules_file = workdir / "rules.yaml"
    rules_file.write_text(rules)
    admin_port = free_port()
    kipside = start_kipside(
        dataclasses.replace(tansu, port=port),
        workdir / "kipside",
        rules=rules_file,
        extra_args=["--admin", f"127.0.0.1:{admin_port}"],
    )
    try:
        yield kipside, admin_port
    finally:
        if kipside.proc.poll() is None:
            kipside.proc.kill()


def _stop(kipside: Kipside) -> None:
    code = kipside.stop()
    assert code == 0, f"kipside exited with {code} after SIGTERM:\n{kipside.log()[-3000:]}"


# --------------------------------------------------------------------------- coalescing

COALESCE_RULES = "coalescing:\n  enabled: true\n  lanes: 2\n  linger_ms: 0\n"


def coalescing_run(
    workdir: Path, *, producers: int = 6, messages: int = 200, partitions: int = 4
) -> Run:
    """`producers` confluent-kafka producers (acks all, 1 and 0 in turn, one idempotent) and one
    aiokafka producer send `messages` records each: many small ProduceRequests (librdkafka: one
    per partition, four records a batch), through kipside's coalescing lanes."""
    workdir.mkdir(parents=True, exist_ok=True)
    relay = CountingRelay(kafka_acks0=True)
    with tansu_behind(relay) as tansu:
        broker_side = Tcpdump(workdir / BROKER_PCAP, [relay.port]).start()
        with _kipside(tansu, relay.port, workdir, COALESCE_RULES) as (kipside, admin_port):
            client_side = Tcpdump(workdir / CLIENT_PCAP, kipside.ports).start()
            create_topics(kipside.bootstrap, ["evidence"], partitions)
            _produce(kipside.bootstrap, producers, messages, partitions)
            kipside_requests = _client_requests(admin_port)
            _stop(kipside)
        dropped = {"client": client_side.stop().dropped, "broker": broker_side.stop().dropped}
        counts = relay.counts()
        batches = relay.batches()
    run = Run(
        "coalescing",
        sorted(kipside.ports),
        relay.port,
        dropped,
        {
            "requests": _names(counts.requests),
            "connections": counts.accepted,
            "produce_batches": len(batches),
            "produce_records": sum(b.records_count for b in batches),
            "acks0_requests": counts.acks0_requests,
        },
        {"client_requests": kipside_requests},
        {"producers": producers, "messages": messages, "partitions": partitions},
    )
    run.save(workdir)
    return run


def _produce(bootstrap: str, producers: int, messages: int, partitions: int) -> None:
    modes: list[dict[str, Any]] = [
        {"acks": "all"},
        {"acks": "1"},
        {"acks": "0"},
        {"enable.idempotence": True},
    ]
    clients = [
        ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"evidence-{i}",
                "linger.ms": 0,
                "batch.num.messages": 4,
                "message.timeout.ms": 30000,
                **modes[i % len(modes)],
            }
        )
        for i in range(producers)
    ]
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    aiokafka = threading.Thread(
        target=asyncio.run, args=(_aiokafka_produce(bootstrap, messages, partitions),)
    )
    try:
        aiokafka.start()
        for n in range(messages):
            for i, producer in enumerate(clients):
                value = f"evidence-{i}-{n:05d}|".encode() + b"x" * (20 + n % 50)
                producer.produce(
                    "evidence", value, partition=(n + i) % partitions, on_delivery=report
                )
                producer.poll(0)
            if n % 8 == 7:
                time.sleep(0.002)  # a pace at which requests meet on the lanes
        for producer in clients:
            assert producer.flush(30) == 0, "undelivered records"
        assert not failed, failed[:5]
        aiokafka.join(60)
        assert not aiokafka.is_alive(), "the aiokafka producer did not finish"
    finally:
        for producer in clients:
            producer.close()
        del clients
        gc.collect()


async def _aiokafka_produce(bootstrap: str, messages: int, partitions: int) -> None:
    """aiokafka writes one request per broker carrying every partition it has a batch for
    (Produce v8: a version tshark's Kafka dissector reads to the partition, unlike
    librdkafka's v9+)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, client_id="evidence-aiokafka", acks=1, linger_ms=2
    )
    await producer.start()
    try:
        for first in range(0, messages, partitions):  # a request per burst, a batch per partition
            burst = [
                await producer.send("evidence", f"aio-{n:05d}".encode(), partition=n % partitions)
                for n in range(first, min(first + partitions, messages))
            ]
            for future in burst:
                await future
    finally:
        await producer.stop()


# --------------------------------------------------------------------------- transactions

TXN_ID = "evidence-txn"
TXN_GROUP = "evidence-group"
TXN_OUTPUT = "evidence-out"
TXN_INPUT = "evidence-in"


def _txn_rules(partitions: int) -> str:
    return (
        "transactions:\n"
        f'  - transactional_id: "{TXN_ID}"\n'
        "    outputs:\n"
        f"      - topic: {TXN_OUTPUT}\n"
        f"    consumer_group: {TXN_GROUP}\n"
        "    hold_begin: {max_ms: 5000}\n"
    )


def transaction_run(
    workdir: Path, *, transactions: int = 20, partitions: int = 4, window_ms: float = 50.0
) -> Run:
    """One confluent-kafka transactional producer: each transaction writes a record to every
    partition of the output topic, one partition after the other, and sends the group's
    offsets; every fifth is aborted. The
    relay answers CONCURRENT_TRANSACTIONS for `window_ms` after each EndTxn, as Apache Kafka
    does while it writes the markers; kipside pre-registers the rule's outputs and group and
    holds the next transaction's begin through that window."""
    workdir.mkdir(parents=True, exist_ok=True)
    relay = MarkerWindowRelay(window_ms=window_ms)
    with tansu_behind(relay) as tansu:
        broker_side = Tcpdump(workdir / BROKER_PCAP, [relay.port]).start()
        rules = _txn_rules(partitions)
        with _kipside(tansu, relay.port, workdir, rules) as (kipside, admin_port):
            client_side = Tcpdump(workdir / CLIENT_PCAP, kipside.ports).start()
            create_topics(kipside.bootstrap, [TXN_OUTPUT], partitions)
            create_topics(kipside.bootstrap, [TXN_INPUT], 1)
            committed = _transact(kipside.bootstrap, transactions, partitions)
            kipside_requests = _client_requests(admin_port)
            _stop(kipside)
        dropped = {"client": client_side.stop().dropped, "broker": broker_side.stop().dropped}
        counts = relay.counts()
        events = relay.events(TXN_ID)
        segments = relay.segments(TXN_ID)
    # What the relay saw, per API: forwarded, and answered itself (in a window).
    requests = Counter(counts.forwarded)
    kinds = {ADD_PARTITIONS: ApiKey.ADD_PARTITIONS_TO_TXN, ADD_OFFSETS: ApiKey.ADD_OFFSETS_TO_TXN}
    for event in events:
        if event.kind != END_TXN and event.outcome != "accepted":
            requests[kinds[event.kind]] += 1
    ended = [s for s in segments if s.end is not None]
    run = Run(
        "transactions",
        sorted(kipside.ports),
        relay.port,
        dropped,
        {
            "requests": _names(requests),
            "connections": counts.connections,
            "transactions_ended": len(ended),
            "committed": sum(1 for s in ended if s.end is not None and s.end.committed),
            "coordinator_round_trips": sum(_round_trips(s) for s in ended),
            "failed_end_txn": sum(1 for e in events if e.kind == END_TXN and e.error_code),
            "concurrent_transactions": {
                "AddPartitionsToTxn": counts.rejected_add_partitions,
                "AddOffsetsToTxn": counts.rejected_add_offsets,
            },
        },
        {"client_requests": kipside_requests, "committed_by_client": committed},
        {"transactions": transactions, "partitions": partitions, "window_ms": window_ms},
    )
    run.save(workdir)
    return run


def _round_trips(segment: Any) -> int:
    return int(
        segment.accepted_add_partitions
        + segment.rejected_add_partitions
        + segment.refused_add_partitions
        + segment.accepted_add_offsets
        + segment.rejected_add_offsets
        + (segment.end is not None)
    )


def _transact(bootstrap: str, transactions: int, partitions: int) -> int:
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "evidence-txn",
            "transactional.id": TXN_ID,
            "linger.ms": 1,
            "transaction.timeout.ms": 60000,
        }
    )
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": TXN_GROUP, "enable.auto.commit": False}
    )
    committed = 0
    try:
        group_metadata = consumer.consumer_group_metadata()
        producer.init_transactions(CALL_TIMEOUT)
        for number in range(transactions):
            producer.begin_transaction()
            for partition in range(partitions):
                # One partition at a time, as a stream processor's outputs come: librdkafka
                # adds each with its own AddPartitionsToTxn.
                value = f"t{number}-p{partition}".encode()
                producer.produce(TXN_OUTPUT, value, partition=partition)
                assert producer.flush(CALL_TIMEOUT) == 0, "undelivered records"
            producer.send_offsets_to_transaction(
                [ck.TopicPartition(TXN_INPUT, 0, number + 1)], group_metadata, CALL_TIMEOUT
            )
            if number % 5 == 4:
                producer.abort_transaction(CALL_TIMEOUT)
            else:
                producer.commit_transaction(CALL_TIMEOUT)
                committed += 1
    finally:
        consumer.close()
        producer.close()
        del producer
        gc.collect()
    return committed
