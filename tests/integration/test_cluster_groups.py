"""Several brokers and leader moves, consumer groups: real group consumers ->
kipside -> a SIMULATED 3-node cluster (relaykit.cluster: ONE Tansu behind three relay ports;
group requests sent to a node that does not coordinate the group get NOT_COORDINATOR, fetches
of partitions a node does not lead get NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH).

- test_group_consumes_across_nodes_through_moves[client]: one group member (confluent-kafka,
  aiokafka; kafka-python's group consume returns nothing on Tansu 0.6.0 without kipside too)
  consumes 600 records of a 6-partition topic (two partitions per node) committing as it
  goes: the first half with the cluster still, the second while partition leaders move every
  0.15 s and the group's coordinator every 0.3 s. Every record is consumed once, in order per
  partition; the committed offsets end at the log end; fetches reached every node, and the
  moves did reach the member: old leaders refused some of its fetches and old coordinators
  some of its group requests, so it found the new ones through kipside.

Run: .venv/bin/pytest tests/integration/test_cluster_groups.py -q -p no:cacheprovider
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import fresh_topic, needs_kipside, unique_name
from relaykit.cluster import SimulatedCluster
from relaykit.kafka_answers import FENCED_LEADER_EPOCH, GROUP, NOT_COORDINATOR, NOT_LEADER

from kipside.protocol import ApiKey

from .clients import CONSUME_TIMEOUT, Msg, assert_exactly_once_in_order, make_messages, run_async
from .clients_aiokafka import aio_group_member
from .clients_confluent import ck_consumer, ck_msg, ck_produce
from .cluster_kit import PARTITIONS, ClusterStack, Mover, cluster_stack, refusals, served

pytestmark = [
    pytest.mark.integration,
    needs_kipside("these tests are about kipside in front of a cluster"),
]

RECORDS = 600
GROUP_CLIENTS = ["confluent-kafka", "aiokafka"]
MIN_MOVES = 6  # leader moves (and 3 coordinator moves) while the member runs
COMMIT_ATTEMPTS = 20  # a commit during a coordinator move is retried, as an application would


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    with cluster_stack(tmp_path_factory.mktemp("cluster-groups")) as s:
        yield s


def _coordinator_mover(cluster: SimulatedCluster, group: str) -> Callable[[int], None]:
    """Move the group's coordinator to the next live node every second leader move."""

    def move(moves: int) -> None:
        if moves % 2 == 0:
            live = cluster.nodes()
            now = cluster.coordinator(GROUP, group)
            cluster.move_coordinator(GROUP, group, live[(live.index(now) + 1) % len(live)])

    return move


class Consumed:
    """Records consumed so far. Once half have arrived the mover starts; the member goes on
    until every record arrived and the mover made MIN_MOVES moves (so its heartbeats and
    commits meet moved coordinators), then looks a moment longer for extra records."""

    def __init__(self, mover: Mover) -> None:
        self.got: list[Msg] = []
        self.mover = mover
        self.moving = False
        self.deadline = time.monotonic() + CONSUME_TIMEOUT

    def add(self, msgs: list[Msg]) -> None:
        self.got += msgs
        if not self.moving and len(self.got) >= RECORDS // 2:
            self.moving = True
            self.mover.__enter__()

    def wanting(self) -> bool:
        assert time.monotonic() < self.deadline, f"got {len(self.got)}/{RECORDS} in time"
        return len(self.got) < RECORDS or self.mover.moves < MIN_MOVES


def _ck_group(bootstrap: str, topic: str, group: str, consumed: Consumed) -> None:
    c = ck_consumer(bootstrap, group)
    try:
        c.subscribe([topic])
        extra_until = None
        while consumed.wanting() or extra_until is None or time.monotonic() < extra_until:
            if extra_until is None and not consumed.wanting():
                extra_until = time.monotonic() + 0.3  # anything beyond RECORDS?
            msgs = c.consume(num_messages=100, timeout=0.2)
            errors = [m.error() for m in msgs if m.error() is not None]
            assert not errors, errors
            if msgs:
                consumed.add([ck_msg(m) for m in msgs])
                _retry(lambda: c.commit(asynchronous=False), "commit")
    finally:
        c.close()


def _retry(commit: Callable[[], Any], what: str) -> None:
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            commit()
            return
        except ck.KafkaException as exc:
            if not exc.args[0].retriable() or attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.1)


async def _aio_group(bootstrap: str, topic: str, group: str, consumed: Consumed) -> None:
    from aiokafka.errors import KafkaError

    c = aio_group_member(bootstrap, group, topic)
    await c.start()
    try:
        extra_until = None
        while consumed.wanting() or extra_until is None or time.monotonic() < extra_until:
            if extra_until is None and not consumed.wanting():
                extra_until = time.monotonic() + 0.3
            batches = await c.getmany(timeout_ms=200)
            msgs = [
                Msg(r.partition, r.key, r.value, tuple((k, bytes(v)) for k, v in r.headers))
                for records in batches.values()
                for r in records
            ]
            if not msgs:
                continue
            consumed.add(msgs)
            for attempt in range(COMMIT_ATTEMPTS):
                try:
                    await c.commit()
                    break
                except KafkaError as exc:
                    if not exc.retriable or attempt == COMMIT_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(0.1)
    finally:
        await c.stop()


def _committed(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    c = ck_consumer(bootstrap, group)
    try:
        parts = [ck.TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
    finally:
        c.close()


@pytest.mark.parametrize("client", GROUP_CLIENTS)
def test_group_consumes_across_nodes_through_moves(
    client: str, stack: ClusterStack, request: pytest.FixtureRequest
) -> None:
    cluster = stack.cluster
    topic = fresh_topic(stack.bootstrap, "groups", PARTITIONS, request)
    sent = make_messages(RECORDS, PARTITIONS, tag="g")
    ck_produce(stack.bootstrap, topic, sent, conf={"enable.idempotence": True})
    group = unique_name("group", request)
    before = cluster.records()
    mover = Mover(cluster, topic, also=_coordinator_mover(cluster, group))
    consumed = Consumed(mover)
    try:
        if client == "confluent-kafka":
            _ck_group(stack.bootstrap, topic, group, consumed)
        else:
            run_async(_aio_group(stack.bootstrap, topic, group, consumed), CONSUME_TIMEOUT + 10)
    finally:
        if consumed.moving:
            mover.__exit__()
    after = cluster.records()

    assert_exactly_once_in_order(sent, consumed.got)
    ends = {p: sum(1 for m in sent if m.partition == p) for p in range(PARTITIONS)}
    assert _committed(stack.bootstrap, topic, group) == ends
    assert mover.moves >= MIN_MOVES, mover.moves
    assert not mover.bypassed, f"the member connected to nodes directly: {mover.bypassed}"
    assert served(before, after, ApiKey.FETCH) == set(cluster.nodes())
    group_refused = sum(
        refusals(before, after, api, NOT_COORDINATOR)
        for api in (ApiKey.HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.JOIN_GROUP)
    )
    assert group_refused > 0, "the coordinator moves never reached the member"
    fetch_refused = sum(
        refusals(before, after, ApiKey.FETCH, code) for code in (NOT_LEADER, FENCED_LEADER_EPOCH)
    )
    assert fetch_refused > 0, "the leader moves never reached the member's fetches"
