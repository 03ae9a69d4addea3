"""A real Tansu behind a relay: the broker must advertise the relay's address, not its own, or
clients would learn the broker's real port from Metadata and bypass the relay."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from testkit.broker import Broker, start_tansu

from .base import LOOPBACK, Relay


@contextmanager
def tansu_behind(relay: Relay) -> Iterator[Broker]:
    """Start `relay` (unless it runs already) and a fresh in-memory Tansu that advertises it;
    yields the broker (its real listener: nothing but the relay should dial it). Clients
    bootstrap from `relay.bootstrap`. Both are stopped on exit, the relay first."""
    if relay.port == 0:
        relay.start()
    try:
        broker = start_tansu(advertised_port=relay.port)
        relay.upstream = (LOOPBACK, broker.port)
        with broker:
            yield broker
    finally:
        relay.close()
