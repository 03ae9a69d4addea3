"""Produce lane placement: acks values on their own lanes, order kept, nothing left pinned.

kipside runs in this process (tests/inprocess.py) so the test can read its LanePlacement; the
broker (Tansu) and the clients (confluent-kafka) are real.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.lanes import LanePlacement

PARTITIONS = 4
MESSAGES = 200


def test_a_clients_partition_stays_on_its_lane_while_outstanding_then_follows_its_acks() -> None:
    placement = LanePlacement()
    assert placement.place("a", 1, "t", 0, -1, 2) == 0  # acks=all starts on lane 0
    assert placement.place("a", 1, "t", 0, 1, 2) == 0  # outstanding there: follows it
    assert placement.place("b", 1, "t", 0, 1, 2) == 1  # another client: no order to keep
    placement.release("a", 1, "t", 0)
    assert placement.place("a", 1, "t", 0, 1, 2) == 0  # still one outstanding
    for _ in range(2):
        placement.release("a", 1, "t", 0)
    placement.release("b", 1, "t", 0)
    assert placement.outstanding() == 0
    assert placement.place("a", 1, "t", 0, 1, 2) == 1  # nothing outstanding: acks=1's lane
    assert placement.place("a", 1, "t", 1, 0, 2) == 0  # acks=0 shares lane 0 when there are 2
    assert placement.place("a", 1, "t", 2, 0, 3) == 2
    assert placement.place("a", 1, "t", 3, -1, 1) == 0  # one lane: everything on it


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


def test_mixed_acks_share_partitions_exactly_once_in_order_and_release_every_lane(  # type: ignore[no-untyped-def]
    start_kipside_in_process, tansu
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

    placement = kipside.server.coalescer.placement  # type: ignore[union-attr]
    assert placement.outstanding() == 0  # every batch answered released its partition

    consumer = Consumer(
        {
            "bootstrap.servers": kipside.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: dict[tuple[str, int], list[int]] = {}
    deadline = time.monotonic() + 30
    total = 0
    while total < MESSAGES * len(confs) and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            if msg.error():
                continue
            name, seq = msg.value().decode().split(":")
            seen.setdefault((name, msg.partition()), []).append(int(seq))
            total += 1
    consumer.close()
    for name in confs:
        for partition in range(PARTITIONS):
            expected = list(range(partition, MESSAGES, PARTITIONS))
            assert seen.get((name, partition)) == expected, (name, partition)
    stats = kipside.server.stats
    assert stats.upstream_requests[0] < stats.client_requests[0]  # Produce was coalesced
