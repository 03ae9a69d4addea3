"""Produce lanes under mixed acks values: order kept per producer and partition, every batch
exactly once, nothing left outstanding.

kipside runs in this process (tests/inprocess.py) so the test can read its produce scheduler;
the broker (Tansu) and the clients (confluent-kafka) are real. The scheduler's placement rules
are tested in memory in tests/test_produce_scheduler.py.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import StartKipside
from testkit.broker import Broker

from .clients_read_back import consume_assigned

PARTITIONS = 4
MESSAGES = 200


def _produce(bootstrap: str, topic: str, name: str, conf: dict[str, object], out: dict) -> None:  # type: ignore[type-arg]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **conf})
    errors: list[str] = []
    for seq in range(MESSAGES):
        producer.produce(
            topic,
            value=f"{name}:{seq}".encode(),
            partition=seq % PARTITIONS,
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
        if seq % 10 == 9:
            producer.flush(30)  # bursts, so batches of both acks values queue together
    out[name] = (producer.flush(30), errors)


def test_mixed_acks_share_partitions_exactly_once_in_order_and_release_every_lane(
    start_kipside_in_process: StartKipside, tansu: Broker
) -> None:
    kipside = start_kipside_in_process(tansu.bootstrap, "coalescing:\n  enabled: true\n")
    topic = f"placement-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": kipside.bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    confs = {
        "all-idem": {"acks": "all", "enable.idempotence": True},
        "one-a": {"acks": 1},
        "one-b": {"acks": 1, "compression.type": "lz4"},
        "all-zstd": {"acks": "all", "compression.type": "zstd"},
    }
    results: dict[str, tuple[int, list[str]]] = {}
    threads = [
        threading.Thread(target=_produce, args=(kipside.bootstrap, topic, n, c, results))
        for n, c in confs.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {name: (0, []) for name in confs}

    assert kipside.server.coalescer is not None
    assert kipside.server.coalescer.outstanding() == 0  # every batch answered is released

    # Read back without a group (a group's join would only add its rebalance delay here).
    messages, _ = consume_assigned(kipside.bootstrap, topic, PARTITIONS, MESSAGES * len(confs))
    seen: dict[tuple[str, int], list[int]] = {}
    for message in messages:
        name, seq = message.value.decode().split(":")
        seen.setdefault((name, message.partition), []).append(int(seq))
    for name in confs:
        for partition in range(PARTITIONS):
            expected = list(range(partition, MESSAGES, PARTITIONS))
            assert seen.get((name, partition)) == expected, (name, partition)
    stats = kipside.server.stats
    assert stats.upstream_requests[0] < stats.client_requests[0]  # Produce was coalesced
