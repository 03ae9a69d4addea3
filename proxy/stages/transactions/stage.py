"""The transactions stage: the transaction calls of transactional ids a rule matches.

TransactionManager (this package) decides which it takes; a taken call is answered later, when
its registration or the broker's answer comes (a `Take`).
"""

from __future__ import annotations

from kipside.proxy.core.decisions import ClientRequest, Decision, Take
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.stages.transactions.manager import TAKEN_APIS, TransactionManager

__all__ = ["TransactionsStage"]


class TransactionsStage:
    api_keys = TAKEN_APIS

    def __init__(self, context: FeatureContext, manager: TransactionManager) -> None:
        self.context = context
        self.manager = manager

    def __call__(self, request: ClientRequest) -> Decision | None:
        header, client = request.header, request.client
        if client.authenticated or not self.manager.takes(header):
            return None
        node_id = self.context.node_for(client.node_id)
        if node_id is None:
            return None
        answer = self.manager.route(
            node_id,
            client.principal,
            request.frame,
            header,
            client.client_id,
            client.span,  # type: ignore[arg-type]
        )
        return None if answer is None else Take(answer, raw=False)
