"""The request pipeline: every stage, in the one order a client's request passes them.

1. SASL (`stages.sasl`): SaslHandshake and SaslAuthenticate, and every request while kipside
   terminates SASL and the client has not authenticated: kipside's answer, the principal
   proved, a refusal; in passthrough the client is marked for its own connection.
2. principals (`stages.principals`): Produce, Fetch, ListOffsets and transaction calls of a
   principal a rule restricts: an UNAUTHORIZED answer, or only the allowed part (narrow).
3. versions (`stages.versions`): an ApiVersions newer than kipside knows: its own answer.
4. transactions (`stages.transactions`): transaction calls of rule-matched transactional ids:
   answered later, locally, after pre-registration, or after the broker's answer.
5. coalescing (`stages.coalescing`): Produce: to the lanes (answered later) or the client's own
   connection; a wait first when a partition changes route.
6. short APIs (`stages.short_apis`): Metadata, FindCoordinator, ListOffsets, ...: a shared lane.
7. own connection (`stages.own_connection`): everything left: the client's own connection.

A stage whose feature is off is left out of the pipeline, so it costs nothing per request: the
principals stage while the rules restrict no principal, the transactions stage while no rule
declares transactions, the sharing stages (4-6) with --one-to-one. A request passes only the
stages that take its API (a stage's `api_keys`): a ProduceRequest meets the SASL stage only
while kipside terminates SASL, and never the versions or short-API stages. The server builds
the pipeline at start and again after each rule reload (`Stages.pipeline`). A new behaviour is
one stage module and one line in STAGE_ORDER.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kipside.proxy.core.decisions import Pipeline, Stage
from kipside.proxy.stages.coalescing import Coalescer
from kipside.proxy.stages.coalescing.stage import CoalescingStage
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.stages.own_connection import own_connection
from kipside.proxy.stages.principals import PrincipalRules
from kipside.proxy.stages.sasl import SaslStage
from kipside.proxy.stages.short_apis import ShortApisStage
from kipside.proxy.stages.transactions import TransactionManager
from kipside.proxy.stages.transactions.stage import TransactionsStage
from kipside.proxy.stages.versions import VersionPolicy
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import RuleSet

__all__ = ["STAGE_ORDER", "Stages"]

STAGE_ORDER: Final = (
    "sasl",
    "principals",
    "versions",
    "transactions",
    "coalescing",
    "short_apis",
    "own_connection",
)
"""The order every request passes the stages (the names are Stages' fields)."""


@dataclass(frozen=True, slots=True)
class Stages:
    """Every stage of one server, made once; `pipeline` picks those in force, in order."""

    sasl: Stage
    principals: PrincipalRules
    versions: VersionPolicy
    transactions: Stage | None
    coalescing: Stage | None
    short_apis: Stage | None
    own_connection: Stage
    transaction_manager: TransactionManager | None = None
    coalescer: Coalescer | None = None

    @classmethod
    def build(
        cls,
        rules: Callable[[], RuleSet],
        versions: VersionPolicy,
        shared: tuple[FeatureContext, NodeMap] | None,
        sasl_terminates: bool = False,
    ) -> Stages:
        """The stages of a server; `shared` (the features' context, the node map) unless every
        client has its own connection only (--one-to-one); `sasl_terminates` when kipside
        answers the clients' SASL itself."""
        sasl = SaslStage(sasl_terminates)
        if shared is None:
            return cls(sasl, PrincipalRules(rules), versions, None, None, None, own_connection)
        context, nodes = shared
        manager = TransactionManager(context)
        coalescer = Coalescer(context, nodes)
        return cls(
            sasl,
            PrincipalRules(rules),
            versions,
            TransactionsStage(context, manager),
            CoalescingStage(context, coalescer),
            ShortApisStage(context),
            own_connection,
            manager,
            coalescer,
        )

    def pipeline(self, rules: RuleSet) -> Pipeline:
        """The stages in force under `rules`, in STAGE_ORDER."""
        off = set()
        if not rules.principals:
            off.add("principals")
        if not rules.transactions:
            off.add("transactions")
        stages = (getattr(self, name) for name in STAGE_ORDER if name not in off)
        return Pipeline(tuple(stage for stage in stages if stage is not None))
