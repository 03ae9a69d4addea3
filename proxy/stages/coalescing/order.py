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
decides again). Between lanes,
LanePlacement keeps each partition on one lane while any of its batches is outstanding, so the
lanes need no waiting here.

acks=0 requests are answered by no one: their order is kept while their route stays the same,
and not across a route change (there is nothing to wait for).

It is bookkeeping only: it never sends, and never waits itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from kipside.proxy.core.answers import Pending
from kipside.proxy.core.decisions import ClientHandle

Partition = tuple[str, int]

PRUNE_AT: Final = 1024
"""Settled answers are dropped once a client has this many partitions on record."""


@dataclass(slots=True)
class _Routes:
    """What one client connection has outstanding on each route."""

    lanes: dict[Partition, Pending] = field(default_factory=dict)
    """Per partition, the answer to the last lane request that carried it."""
    own: dict[Partition, Pending] = field(default_factory=dict)
    """Per partition, an answer on the own connection due no earlier than its last batch's."""
    own_any: Pending | None = None
    """Due no earlier than the last unread request the own connection carried."""
    own_unlearned: bool = False
    """A request was just routed to the own connection and its answer is not known yet (the
    session sends it after routing)."""
    own_unlearned_partitions: tuple[Partition, ...] | None = None
    """That request's partitions (None: unread)."""


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
        partition), which this request must wait for before it goes; None when it may go now."""
        routes = self._clients.get(client)
        if routes is None:
            return None
        self._learn_own(client, routes)
        if to_lanes:
            if routes.own_any is not None:
                if not routes.own_any.done:
                    return routes.own_any
                routes.own_any = None
            other = routes.own
        else:
            other = routes.lanes
        if partitions is None:
            partitions = list(other)
        for partition in partitions:
            pending = other.get(partition)
            if pending is not None:
                if not pending.done:
                    return pending
                del other[partition]
        return None

    def sent_to_lanes(
        self, client: ClientHandle, partitions: Sequence[Partition], pending: Pending | None
    ) -> None:
        """The request went to the lanes; `pending` is its answer (None for acks=0)."""
        routes = self._routes(client)
        if pending is None:
            return
        _record(routes.lanes, partitions, pending)

    def sent_own(self, client: ClientHandle, partitions: Sequence[Partition] | None) -> None:
        """The request goes to the client's own connection (None: its partitions are unread)."""
        routes = self._routes(client)
        routes.own_unlearned = True
        routes.own_unlearned_partitions = None if partitions is None else tuple(partitions)

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
        sent = routes.own_unlearned_partitions
        last = client.newest_own()
        if last is None:
            return
        if sent is None:
            routes.own_any = last
            return
        _record(routes.own, sent, last)


def _record(
    answers: dict[Partition, Pending], partitions: Iterable[Partition], pending: Pending
) -> None:
    """`pending` is now the latest answer owed for these partitions on one route; answers
    already given are dropped once the route remembers more than PRUNE_AT partitions."""
    for partition in partitions:
        answers[partition] = pending
    if len(answers) > PRUNE_AT:
        for done in [p for p, owed in answers.items() if owed.done]:
            del answers[done]
