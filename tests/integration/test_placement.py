"""Produce lane placement: acks values on their own lanes, order kept, nothing left pinned.

kipside runs in this process (tests/inprocess.py) so the test can read its LanePlacement; the
broker (Tansu) and the clients (confluent-kafka) are real.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import StartKipside
from testkit.broker import Broker

from kipside.proxy.stages.coalescing.placement import LanePlacement, lane_index

from .clients_read_back import consume_assigned

PARTITIONS = 4
MESSAGES = 200


def test_a_clients_partition_stays_on_its_lane_while_outstanding() -> None:
    placement = LanePlacement()
    hashed = lane_index("t", 0, 2)
    assert placement.place("a", 1, "t", 0, -1, 2) == hashed  # one acks value: spread by hash
    assert placement.place("a", 1, "t", 0, 1, 2) == hashed  # outstanding there: follows it
    placement.release("a", 1, "t", 0)
    placement.release("a", 1, "t", 0)
    assert placement.outstanding() == 0


def test_while_acks_values_mix_each_goes_to_its_own_lane() -> None:
    placement = LanePlacement()
    placement.place("a", 1, "t", 0, -1, 2)  # an acks=all batch outstanding on node 1
    assert placement.place("b", 1, "t", 1, 1, 2) == 1  # acks=1 meets it: acks=1's lane
    assert placement.place("c", 1, "t", 2, -1, 2) == 0  # and acks=all now goes to lane 0
    assert placement.place("d", 1, "t", 3, 0, 3) == 2  # acks=0: lane 2 when there are 3
    assert placement.place("e", 2, "t", 1, 1, 2) == lane_index("t", 1, 2)  # other node: alone
    for client, node, partition in (("a", 1, 0), ("b", 1, 1), ("c", 1, 2), ("d", 1, 3)):
        placement.release(client, node, "t", partition)
    assert placement.place("f", 1, "t", 5, 1, 2) == lane_index("t", 5, 2)  # no mix any more


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
    placement = kipside.server.coalescer.placement
    assert placement.outstanding() == 0  # every batch answered released its partition

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
