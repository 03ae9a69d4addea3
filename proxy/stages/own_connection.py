"""The last stage: whatever no other stage took goes on the client's own broker connection."""

from __future__ import annotations

from kipside.proxy.core.decisions import FORWARD_OWN, ClientRequest, Decision

__all__ = ["own_connection"]


def own_connection(request: ClientRequest) -> Decision:
    return FORWARD_OWN
