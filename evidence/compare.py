"""Two captures of the same traffic, one on each side of kipside, and what kipside saved.

The client side is taken between the clients and kipside, the broker side between kipside and
the brokers. Savings are client side minus broker side: requests avoided (all APIs, and Produce
alone), coordinator round trips avoided (AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, in
ended and open transactions alike) and connections avoided. A negative saving is reported as
it is: kipside's own requests (its discovery, its pre-registrations) are on the broker side too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .analyse import Progress, summarize
from .summary import Summary

__all__ = ["Comparison", "compare"]


def _round_trips(summary: Summary) -> int:
    t = summary.transactions
    return t.round_trips + t.open_round_trips


@dataclass(frozen=True)
class Comparison:
    client: Summary
    broker: Summary

    @property
    def requests_avoided(self) -> int:
        return self.client.requests - self.broker.requests

    @property
    def produce_requests_avoided(self) -> int:
        return self.client.produce.requests - self.broker.produce.requests

    @property
    def round_trips_avoided(self) -> int:
        """Transaction coordinator round trips."""
        return _round_trips(self.client) - _round_trips(self.broker)

    @property
    def connections_avoided(self) -> int:
        return sum(self.client.connections.values()) - sum(self.broker.connections.values())

    def savings(self) -> dict[str, int]:
        return {
            "requests_avoided": self.requests_avoided,
            "produce_requests_avoided": self.produce_requests_avoided,
            "coordinator_round_trips_avoided": self.round_trips_avoided,
            "connections_avoided": self.connections_avoided,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "client_side": self.client.as_dict(),
            "broker_side": self.broker.as_dict(),
            "savings": self.savings(),
        }


def compare(
    client_side: str | Path,
    broker_side: str | Path,
    *,
    client_ports: Iterable[int] = (),
    broker_ports: Iterable[int] = (),
    progress: Progress | None = None,
) -> Comparison:
    """Summarise both captures (see analyse.summarize) and set them side by side."""
    return Comparison(
        summarize(client_side, client_ports, progress),
        summarize(broker_side, broker_ports, progress),
    )
