"""What the server hands every feature: shared connections, rules, counters, tracer, nursery.

Kroxylicious hands each filter a context of what the runtime provides; kipside's features get
this one frozen value from proxy.server. A feature reads the rules through it for every
request, so a rule reload reaches every feature between two requests with nothing to push.
It holds no per-request state and never dials anything itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from kipside.proxy.core.identity import Principal
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import Tracer
from kipside.proxy.upstream.lanes import LanePool
from kipside.rules import RuleSet


@dataclass(frozen=True, slots=True)
class FeatureContext:
    pools: Callable[[int, Principal], LanePool]
    """A broker node's shared connections for one principal (the server makes each pool on
    first use; two principals never share one)."""
    default_node: Callable[[], int | None]
    """The node that serves bootstrap connections' shared traffic; None before any is known."""
    rules: Callable[[], RuleSet]
    """The rules in force now."""
    stats: Stats
    nursery: trio.Nursery
    """Where features run their background tasks (produce lanes, transaction registrations)."""
    tracer: Tracer | None = None
    """Set while spans are made."""

    def node_for(self, node_id: int | None) -> int | None:
        """The node a client's shared traffic goes to: the one whose listener it dialled, or
        the default node for a bootstrap connection."""
        return node_id if node_id is not None else self.default_node()
