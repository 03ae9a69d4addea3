"""A client's produce order when its requests change route.

A client's ProduceRequest goes upstream on the shared lanes (coalesced or passed through) or on
the client's own broker connection, as the coalescing rules say, request by request: a request
naming a topic a rule excludes goes on the own connection whole, the next one may not name it
and go to the lanes; a rule reload switches coalescing on or off for a topic, or altogether.
A broker keeps order per connection only. Two routes are two connections, so a partition's
batch on the new route can reach the broker before the same client's earlier batch of that
partition, still queued or in flight on the old one: out of order for any producer, and
OUT_OF_ORDER_SEQUENCE_NUMBER (fatal) for an idempotent one.

ProduceOrder remembers, per client connection and partition, the route its last batch took and
the answer that settles it; a request that would take a partition the other way first waits
for that answer (the coalescing stage returns a Wait: the session waits, then the pipeline
decides again). Between lanes, the produce scheduler keeps each partition of a client on one
lane while any of its batches is outstanding, so the lanes need no waiting here.

acks=0 requests are answered by no one, so a route they took is settled by a barrier instead:
a request of kipside's own sent behind them on the same connection (the lane, or the client's
own connection), which the broker answers only once it has handled them. It is sent only when
a partition that went acks=0 one way is about to go the other way. A request whose partitions
were not read (coalescing off) is settled by a barrier on the own connection as well.

It is bookkeeping only: it never sends itself (a barrier is a callable of the route's driver),
and never waits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from kipside.proxy.core.answers import Pending
from kipside.proxy.core.decisions import ClientHandle

Partition = tuple[str, int]
Barrier: TypeAlias = Callable[[], Pending]
"""Sends a request of kipside's own behind what a route carries now; its answer comes once the
broker has handled all of that."""

PRUNE_AT: Final = 1024
"""Settled answers are dropped once a client has this many partitions on record."""


@dataclass(slots=True)
class _Routes:
    """What one client connection has outstanding on each route."""

    lanes: dict[Partition, Pending | Barrier] = field(default_factory=dict)
    """Per partition, the answer to the last lane request that carried it, or (acks=0) the
    barrier of the lane it took."""
    own: dict[Partition, Pending] = field(default_factory=dict)
    """Per partition, an answer on the own connection due no earlier than its last batch's."""
    own_any: Pending | None = None
    """Due no earlier than every request the own connection carried (a barrier's answer)."""
    own_unanswered: set[Partition] = field(default_factory=set)
    """Partitions whose acks=0 batches went on the own connection since its last barrier."""
    own_unread: bool = False
    """A request whose partitions were not read went on the own connection since its last
    barrier."""
    own_unlearned: bool = False
    """A request was just routed to the own connection and its answer is not known yet (the
    session sends it after routing)."""
    own_unlearned_partitions: tuple[Partition, ...] = ()
    """That request's partitions."""


class ProduceOrder:
    """Per client connection: which route each partition took last, and what settles it."""

    def __init__(self) -> None:
        self._clients: weakref.WeakKeyDictionary[ClientHandle, _Routes] = (
            weakref.WeakKeyDictionary()
        )

    def earlier(
        self, client: ClientHandle, partitions: Sequence[Partition] | None, to_lanes: bool
    ) -> Pending | None:
        """An answer still owed on the other route for one of these partitions (None: any
        partition), which this request must wait for before it goes; None when it may go now.
        Sends the barriers that answer needs, if any."""
        routes = self._clients.get(client)
        if routes is None:
            return None
        self._learn_own(client, routes)
        if to_lanes:
            assert partitions is not None
            if routes.own_unread or not routes.own_unanswered.isdisjoint(partitions):
                routes.own_any = client.own_barrier()  # behind all of them: clears them all
                routes.own_unread = False
                routes.own_unanswered.clear()
            if routes.own_any is not None:
                if not routes.own_any.done:
                    return routes.own_any
                routes.own_any = None
            return _first_owed(routes.own, partitions)
        lanes = routes.lanes
        if partitions is None:
            partitions = list(lanes)
        sent: dict[Barrier, Pending] = {}  # one barrier per lane
        for partition in partitions:
            owed = lanes.get(partition)
            if owed is not None and not isinstance(owed, Pending):
                barrier = sent.get(owed)
                if barrier is None:
                    barrier = sent[owed] = owed()
                lanes[partition] = barrier
        return _first_owed(lanes, partitions)  # type: ignore[arg-type]

    def sent_to_lanes(
        self, client: ClientHandle, partitions: Sequence[Partition], pending: Pending
    ) -> None:
        """The request went to the lanes; `pending` is its answer."""
        _record(self._routes(client).lanes, partitions, pending)

    def sent_to_lanes_unanswered(
        self, client: ClientHandle, barriers: Mapping[Partition, Barrier]
    ) -> None:
        """An acks=0 request went to the lanes: per partition, the barrier of its lane."""
        lanes = self._routes(client).lanes
        lanes.update(barriers)
        if len(lanes) > PRUNE_AT:
            _prune(lanes)

    def sent_own(
        self, client: ClientHandle, partitions: Sequence[Partition] | None, acks: int
    ) -> None:
        """The request goes to the client's own connection (partitions None: not read)."""
        routes = self._routes(client)
        if partitions is None:
            routes.own_unread = True
        elif acks == 0:
            routes.own_unanswered.update(partitions)
        else:
            routes.own_unlearned = True
            routes.own_unlearned_partitions = tuple(partitions)

    def _routes(self, client: ClientHandle) -> _Routes:
        routes = self._clients.get(client)
        if routes is None:
            routes = self._clients[client] = _Routes()
        else:
            self._learn_own(client, routes)
        return routes

    def _learn_own(self, client: ClientHandle, routes: _Routes) -> None:
        """Find the answer of the request last routed to the own connection.

        The session sends it right after routing, before it reads the client's next request,
        so by the next request it is the newest in flight on that connection (or answered,
        with everything before it)."""
        if not routes.own_unlearned:
            return
        routes.own_unlearned = False
        last = client.newest_own()
        if last is not None:
            _record(routes.own, routes.own_unlearned_partitions, last)


def _first_owed(
    answers: dict[Partition, Pending], partitions: Iterable[Partition]
) -> Pending | None:
    """The first answer still owed for one of `partitions`; those given are forgotten."""
    for partition in partitions:
        pending = answers.get(partition)
        if pending is not None:
            if not pending.done:
                return pending
            del answers[partition]
    return None


def _record(
    answers: dict[Partition, Pending] | dict[Partition, Pending | Barrier],
    partitions: Iterable[Partition],
    pending: Pending,
) -> None:
    """`pending` is now the latest answer owed for these partitions on one route; answers
    already given are dropped once the route remembers more than PRUNE_AT partitions."""
    for partition in partitions:
        answers[partition] = pending
    if len(answers) > PRUNE_AT:
        _prune(answers)


def _prune(answers: dict[Partition, Pending] | dict[Partition, Pending | Barrier]) -> None:
    done = [p for p, owed in answers.items() if isinstance(owed, Pending) and owed.done]
    for partition in done:
        del answers[partition]
