"""Real consumer groups through kipside to the real broker (Tansu): member A consumes alone,
member B joins, the group rebalances; every message is consumed exactly once across the
members and the committed offsets end at the end of the topic. confluent-kafka and aiokafka
(each its own group protocol implementation); kafka-python's group consume returns nothing on
Tansu 0.6.0 (seen without kipside).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from conftest import NewTopicFactory, unique_name

from .clients import Msg, assert_exactly_once_in_order, call_with_deadline, make_messages, run_async
from .clients_aiokafka import aio_group_member, aio_produce
from .clients_confluent import ck_consumer, ck_msg, ck_produce, group_committed
from .clients_read_back import consume_assigned

pytestmark = pytest.mark.integration

PARTS = 4
GROUP_DEADLINE = 30.0


@dataclass(frozen=True)
class Rebalance:
    """One rebalance scenario: its topic and group, the messages produced before B joins and
    those produced after."""

    topic: str
    group: str
    first: list[Msg]
    second: list[Msg]

    @property
    def total(self) -> int:
        return len(self.first) + len(self.second)


def _rebalance(new_topic: NewTopicFactory) -> Rebalance:
    return Rebalance(
        new_topic(PARTS),
        unique_name("g"),
        make_messages(200, PARTS, tag="first"),
        make_messages(200, PARTS, tag="second"),
    )


@dataclass
class Tally:
    """What the members consumed, in order: all together and per member."""

    consumed: list[Msg] = field(default_factory=list)
    by_member: dict[str, list[Msg]] = field(default_factory=lambda: {"A": [], "B": []})

    def add(self, name: str, m: Msg) -> None:
        self.consumed.append(m)
        self.by_member[name].append(m)

    def short_of(self, n: int, who: str) -> str | None:
        """None once `n` messages are consumed; else how many `who` got."""
        return None if len(self.consumed) >= n else f"{who} got {len(self.consumed)}/{n}"

    def assert_both_consumed_exactly_once(self, case: Rebalance) -> None:
        assert self.by_member["B"], "member B consumed nothing after the rebalance"
        assert any(m.value.startswith(b"second") for m in self.by_member["A"]), "A idle after join"
        assert_exactly_once_in_order(case.first + case.second, self.consumed)


def _unbalanced(a: Any, b: Any) -> str | None:
    """None once members A and B hold disjoint partitions that cover the topic; else what they
    hold (confluent-kafka's and aiokafka's assignment() alike)."""
    pa = {tp.partition for tp in a.assignment()}
    pb = {tp.partition for tp in b.assignment()}
    if pa and pb and not pa & pb and pa | pb == set(range(PARTS)):
        return None
    return f"no rebalance: A has {sorted(pa)}, B has {sorted(pb)}"


def _high_watermarks(bootstrap: str, topic: str, partitions: int, expect: int) -> dict[int, int]:
    """High watermarks as Fetch reports them (Tansu's ListOffsets(latest) is wrong)."""
    _, marks = consume_assigned(bootstrap, topic, partitions, expect)
    return {p: hi for p, (_lo, hi) in marks.items()}


# --------------------------------------------------------------------------- confluent-kafka


class ConfluentGroup:
    """confluent-kafka members of one group (range assignment); a member whose partitions are
    revoked commits first, so the next owner starts exactly where it stopped."""

    def __init__(self, bootstrap: str, case: Rebalance) -> None:
        self.bootstrap, self.case = bootstrap, case
        self.members: dict[str, ck.Consumer] = {}
        self.tally = Tally()
        self.commit_errors: list[str] = []

    def join(self, name: str) -> ck.Consumer:
        c = ck_consumer(
            self.bootstrap,
            self.case.group,
            **{"partition.assignment.strategy": "range", "client.id": name},
        )

        def on_revoke(consumer: ck.Consumer, _partitions: list[ck.TopicPartition]) -> None:
            try:  # hand over exactly where we stopped
                consumer.commit(asynchronous=False)
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError._NO_OFFSET:
                    self.commit_errors.append(str(exc))

        c.subscribe([self.case.topic], on_revoke=on_revoke)
        self.members[name] = c
        return c

    def poll(self) -> None:
        """One poll of each member, in the order they joined."""
        for name, c in self.members.items():
            m = c.poll(0.1)
            if m is None:
                continue
            assert not m.error(), f"{name}: {m.error()}"
            self.tally.add(name, ck_msg(m))

    def poll_until(self, missing: Callable[[], str | None]) -> None:
        """Poll until `missing()` says nothing is missing, or fail with what still is."""
        deadline = time.monotonic() + GROUP_DEADLINE
        while (what := missing()) is not None:
            assert time.monotonic() < deadline, what
            self.poll()

    def close(self) -> None:
        for name, c in self.members.items():
            call_with_deadline(c.close, 15, f"consumer {name} close")


def _assert_confluent_committed_at_end(
    bootstrap: str, case: Rebalance, members: ConfluentGroup
) -> None:
    """The high watermarks, the group's committed offsets as an admin client reads them and as
    each member reads its own: all the same, the end of every partition."""
    ends = _high_watermarks(bootstrap, case.topic, PARTS, case.total)
    assert ends == {p: 100 for p in range(PARTS)}
    assert group_committed(bootstrap, case.group, case.topic) == ends
    committed = {
        tp.partition: tp.offset
        for c in members.members.values()
        for tp in c.committed(list(c.assignment()), timeout=10)
    }
    assert committed == ends


def test_confluent_group_rebalance(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """Member A consumes alone; member B joins; both get partitions; every message is consumed
    exactly once across the members; committed offsets equal the end offsets."""
    case = _rebalance(new_topic)
    ck_produce(bootstrap, case.topic, case.first)
    members = ConfluentGroup(bootstrap, case)
    tally = members.tally
    try:
        a = members.join("A")
        members.poll_until(lambda: tally.short_of(len(case.first), "A alone"))
        a.commit(asynchronous=False)
        assert {tp.partition for tp in a.assignment()} == set(range(PARTS))

        b = members.join("B")
        members.poll_until(lambda: _unbalanced(a, b))

        ck_produce(bootstrap, case.topic, case.second)
        members.poll_until(lambda: tally.short_of(case.total, "members"))
        for _ in range(5):  # anything extra (a duplicate) would show up here
            members.poll()
        a.commit(asynchronous=False)
        b.commit(asynchronous=False)

        assert not members.commit_errors, members.commit_errors
        tally.assert_both_consumed_exactly_once(case)
        _assert_confluent_committed_at_end(bootstrap, case, members)
    finally:
        members.close()


# --------------------------------------------------------------------------- aiokafka


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """An aiokafka member commits before its partitions are revoked."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked:
            await self.consumer.commit()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        pass


class AiokafkaGroup:
    """aiokafka members of one group, committing on revoke (CommitOnRevoke)."""

    def __init__(self, bootstrap: str, case: Rebalance) -> None:
        self.bootstrap, self.case = bootstrap, case
        self.members: dict[str, AIOKafkaConsumer] = {}
        self.tally = Tally()

    async def join(self, name: str) -> AIOKafkaConsumer:
        c: AIOKafkaConsumer = aio_group_member(
            self.bootstrap, self.case.group, client_id=name, rebalance_timeout_ms=10000
        )
        try:
            await c.start()
        except BaseException:
            await c.stop()
            raise
        c.subscribe([self.case.topic], listener=CommitOnRevoke(c))
        self.members[name] = c
        return c

    async def _poll_member(self, name: str, c: AIOKafkaConsumer) -> None:
        for recs in (await c.getmany(timeout_ms=100)).values():
            for r in recs:
                headers = tuple((k, bytes(v)) for k, v in r.headers)
                self.tally.add(name, Msg(r.partition, r.key, r.value, headers))

    async def poll(self) -> None:
        """One poll of every member at the same time."""
        await asyncio.gather(*(self._poll_member(n, c) for n, c in self.members.items()))

    async def poll_until(self, missing: Callable[[], str | None]) -> None:
        """Poll until `missing()` says nothing is missing, or fail with what still is."""
        deadline = time.monotonic() + GROUP_DEADLINE
        while (what := missing()) is not None:
            assert time.monotonic() < deadline, what
            await self.poll()

    async def committed(self) -> dict[int, int]:
        """Each member's committed offset of each partition it holds."""
        committed = {}
        for c in self.members.values():
            for tp in c.assignment():
                committed[tp.partition] = await c.committed(tp)
        return committed

    async def stop(self) -> None:
        for c in self.members.values():
            await c.stop()


async def _aiokafka_rebalance(bootstrap: str, case: Rebalance) -> None:
    await aio_produce(bootstrap, case.topic, case.first)
    members = AiokafkaGroup(bootstrap, case)
    tally = members.tally
    try:
        a = await members.join("A")
        await members.poll_until(lambda: tally.short_of(len(case.first), "A alone"))
        await a.commit()
        assert {tp.partition for tp in a.assignment()} == set(range(PARTS))

        b = await members.join("B")
        await members.poll_until(lambda: _unbalanced(a, b))

        await aio_produce(bootstrap, case.topic, case.second)
        await members.poll_until(lambda: tally.short_of(case.total, "members"))
        for _ in range(3):
            await members.poll()
        await a.commit()
        await b.commit()

        tally.assert_both_consumed_exactly_once(case)
        ends = {tp.partition: c.highwater(tp) for c in (a, b) for tp in c.assignment()}
        assert ends == {p: 100 for p in range(PARTS)}
        assert await members.committed() == ends
    finally:
        await members.stop()


def test_aiokafka_group_rebalance(bootstrap: str, new_topic: NewTopicFactory) -> None:
    """The same rebalance scenario with aiokafka (its own group protocol implementation)."""
    case = _rebalance(new_topic)
    run_async(_aiokafka_rebalance(bootstrap, case), timeout=90)
    ends = _high_watermarks(bootstrap, case.topic, PARTS, case.total)
    assert group_committed(bootstrap, case.group, case.topic) == ends
