"""stages.coalescing.order.ProduceOrder: what a ProduceRequest changing route must wait for.

The bookkeeping alone, with kipside's own Pending answers and a client whose own broker
connection is a stand-in with one answer in flight; tests/integration/test_route_order.py
runs it end to end (kafka-python, kipside, a relay that slows one route, Tansu).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kipside.proxy.core.answers import Pending
from kipside.proxy.stages.coalescing import ProduceOrder

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


@dataclass
class OwnConnection:
    """The client's own broker connection: the answer it owes last, if any."""

    in_flight: list[Pending] = field(default_factory=list)

    def last_in_flight(self) -> Pending | None:
        return self.in_flight[-1] if self.in_flight else None


@dataclass(eq=False)
class Client:
    dedicated: OwnConnection | None = field(default_factory=OwnConnection)

    def newest_own(self) -> Pending | None:
        return self.dedicated.last_in_flight() if self.dedicated is not None else None

    def send_own(self) -> Pending:
        """What the session does after the route said 'own connection'."""
        pending = Pending()
        assert self.dedicated is not None
        self.dedicated.in_flight.append(pending)
        return pending


def test_a_partition_moving_to_the_lanes_waits_for_its_own_connection_answer() -> None:
    order, client = ProduceOrder(), Client()
    order.sent_own(client, [A0, B0])  # type: ignore[arg-type]
    own = client.send_own()
    assert order.earlier(client, [A0], to_lanes=True) is own  # type: ignore[arg-type]
    assert order.earlier(client, [A1], to_lanes=True) is None  # type: ignore[arg-type]
    own.resolve(b"answer")
    assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]


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


def test_an_unread_request_waits_for_every_partition_on_the_other_route() -> None:
    # Coalescing switched off by a reload: the next request is not read at all.
    order, client = ProduceOrder(), Client()
    lane = Pending()
    order.sent_to_lanes(client, [B0], lane)  # type: ignore[arg-type]
    assert order.earlier(client, None, to_lanes=False) is lane  # type: ignore[arg-type]
    lane.resolve(b"answer")
    order.sent_own(client, None)  # type: ignore[arg-type]
    own = client.send_own()
    # ... and switched on again: any partition waits for the unread request's answer.
    assert order.earlier(client, [A1], to_lanes=True) is own  # type: ignore[arg-type]
    own.resolve(b"answer")
    assert order.earlier(client, [A1], to_lanes=True) is None  # type: ignore[arg-type]


def test_nothing_waits_without_a_route_change_or_for_another_client() -> None:
    order, client, other = ProduceOrder(), Client(), Client()
    for _ in range(3):  # pipelined, nothing answered
        assert order.earlier(client, [A0], to_lanes=True) is None  # type: ignore[arg-type]
        order.sent_to_lanes(client, [A0], Pending())  # type: ignore[arg-type]
    assert order.earlier(other, [A0], to_lanes=False) is None  # type: ignore[arg-type]
    order.sent_own(other, [A0])  # type: ignore[arg-type]
    other.send_own()
    assert order.earlier(other, [A0], to_lanes=False) is None  # type: ignore[arg-type]
    # acks=0 on the lanes: no answer to wait for (documented: not ordered across a change).
    order.sent_to_lanes(other, [B0], None)  # type: ignore[arg-type]
    assert order.earlier(other, [B0], to_lanes=False) is None  # type: ignore[arg-type]
