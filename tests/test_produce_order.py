"""stages.coalescing.order.ProduceOrder: what a ProduceRequest changing route must wait for.

The bookkeeping alone, with kipside's own Pending answers, a client whose own broker connection
is a stand-in that records what it carries, and lanes whose barriers are stand-ins too;
tests/integration/test_route_order.py runs it end to end (kafka-python, kipside, a relay that
slows one route, Tansu).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kipside.proxy.core.answers import Pending
from kipside.proxy.stages.coalescing import ProduceOrder

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


@dataclass
class OwnConnection:
    """The client's own broker connection: the answers it owes, barriers included."""

    in_flight: list[Pending] = field(default_factory=list)
    barriers: int = 0

    def last_in_flight(self) -> Pending | None:
        return self.in_flight[-1] if self.in_flight else None


@dataclass(eq=False)
class Client:
    dedicated: OwnConnection = field(default_factory=OwnConnection)

    def newest_own(self) -> Pending | None:
        return self.dedicated.last_in_flight()

    def own_barrier(self) -> Pending:
        self.dedicated.barriers += 1
        return self.send_own()

    def send_own(self) -> Pending:
        """What the session does after the route said 'own connection'."""
        pending = Pending()
        self.dedicated.in_flight.append(pending)
        return pending


@dataclass(eq=False)
class Lane:
    """One lane's barrier: each call sends one."""

    sent: list[Pending] = field(default_factory=list)

    def barrier(self) -> Pending:
        self.sent.append(Pending())
        return self.sent[-1]


def test_a_partition_moving_to_the_lanes_waits_for_its_own_connection_answer() -> None:
    order, client = ProduceOrder(), Client()
    order.sent_own(client, [A0, B0], 1)  # type: ignore[arg-type]
    own = client.send_own()
    assert order.earlier(client, [A0], to_lanes=True) is own  # type: ignore[arg-type]
    assert order.earlier(client, [A1], to_lanes=True) is None  # type: ignore[arg-type]
    own.resolve(b"answer")
    assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]
    assert client.dedicated.barriers == 0


def test_a_partition_moving_to_its_own_connection_waits_for_its_lane_answer() -> None:
    order, client = ProduceOrder(), Client()
    first, second = Pending(), Pending()
    order.sent_to_lanes(client, [A0], first)  # type: ignore[arg-type]
    order.sent_to_lanes(client, [A0, B0], second)  # type: ignore[arg-type]
    assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]
    assert order.earlier(client, [B0, A1], to_lanes=False) is second  # type: ignore[arg-type]
    assert order.earlier(client, [A1], to_lanes=False) is None  # type: ignore[arg-type]
    second.fail("lane lost")  # a failed answer settles it too (the client is disconnected)
    assert order.earlier(client, [A0, B0], to_lanes=False) is None  # type: ignore[arg-type]


def test_an_unread_request_is_settled_by_a_barrier_on_the_own_connection() -> None:
    # Coalescing switched off by a reload: the next request is not read at all.
    order, client = ProduceOrder(), Client()
    lane = Pending()
    order.sent_to_lanes(client, [B0], lane)  # type: ignore[arg-type]
    assert order.earlier(client, None, to_lanes=False) is lane  # type: ignore[arg-type]
    lane.resolve(b"answer")
    order.sent_own(client, None, -1)  # type: ignore[arg-type]
    client.send_own()  # acks unknown: it may owe nothing
    # ... and switched on again: any partition waits for a barrier behind the unread request.
    barrier = order.earlier(client, [A1], to_lanes=True)  # type: ignore[arg-type]
    assert barrier is client.dedicated.in_flight[-1] and client.dedicated.barriers == 1
    assert order.earlier(client, [B0], to_lanes=True) is barrier  # type: ignore[arg-type]
    barrier.resolve(b"answer")
    assert order.earlier(client, [A1], to_lanes=True) is None  # type: ignore[arg-type]
    assert client.dedicated.barriers == 1


def test_acks0_batches_on_the_own_connection_are_settled_by_one_barrier() -> None:
    order, client = ProduceOrder(), Client()
    order.sent_own(client, [A0], 0)  # type: ignore[arg-type]
    order.sent_own(client, [B0], 0)  # type: ignore[arg-type]
    assert order.earlier(client, [A1], to_lanes=True) is None  # type: ignore[arg-type]
    assert client.dedicated.barriers == 0  # A1 never went acks=0: no barrier
    barrier = order.earlier(client, [A0], to_lanes=True)  # type: ignore[arg-type]
    assert barrier is not None and client.dedicated.barriers == 1
    # B0's batch went before the barrier too: it waits for the same one, none is sent again.
    assert order.earlier(client, [B0], to_lanes=True) is barrier  # type: ignore[arg-type]
    barrier.resolve(b"answer")
    assert order.earlier(client, [A0, B0], to_lanes=True) is None  # type: ignore[arg-type]
    assert client.dedicated.barriers == 1


def test_acks0_batches_on_the_lanes_are_settled_by_their_lanes_barriers() -> None:
    order, client = ProduceOrder(), Client()
    lane0, lane1 = Lane(), Lane()
    order.sent_to_lanes_unanswered(client, {A0: lane0.barrier, A1: lane1.barrier})  # type: ignore[arg-type]
    order.sent_to_lanes_unanswered(client, {B0: lane0.barrier})  # type: ignore[arg-type]
    assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]
    assert not lane0.sent and not lane1.sent  # no route change, no barrier
    first = order.earlier(client, [A0, B0, A1], to_lanes=False)  # type: ignore[arg-type]
    # One barrier per lane, sent together; the first still owed is waited for.
    assert len(lane0.sent) == 1 and len(lane1.sent) == 1 and first is lane0.sent[0]
    lane0.sent[0].resolve(b"answer")
    assert order.earlier(client, [A0, B0, A1], to_lanes=False) is lane1.sent[0]  # type: ignore[arg-type]
    lane1.sent[0].resolve(b"answer")
    assert order.earlier(client, [A0, B0, A1], to_lanes=False) is None  # type: ignore[arg-type]
    assert len(lane0.sent) == 1 and len(lane1.sent) == 1


def test_nothing_waits_without_a_route_change_or_for_another_client() -> None:
    order, client, other = ProduceOrder(), Client(), Client()
    for _ in range(3):  # pipelined, nothing answered
        assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]
        order.sent_to_lanes(client, [A0], Pending())  # type: ignore[arg-type]
    assert order.earlier(other, [A0], to_lanes=False) is None  # type: ignore[arg-type]
    order.sent_own(other, [A0], 1)  # type: ignore[arg-type]
    other.send_own()
    assert order.earlier(other, [A0], to_lanes=False) is None  # type: ignore[arg-type]
    order.sent_own(other, [B0], 0)  # type: ignore[arg-type]
    assert order.earlier(other, [B0], to_lanes=False) is None  # type: ignore[arg-type]
    assert other.dedicated.barriers == 0
