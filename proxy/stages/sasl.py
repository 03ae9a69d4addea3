"""The SASL stage: a client's SaslHandshake and SaslAuthenticate, and its legacy raw tokens.

The client's SASL state machine is security.client_sasl.ClientSasl (one per connection: carried
to the broker, or answered by kipside with --sasl-credentials); this stage turns its steps into
decisions. Passthrough: the client is marked `authenticated`, and the stages that share
connections leave it and every later request of it to its own connection (a SASL identity
belongs to one connection). Termination: kipside answers, switches the client to the principal
it proved, or refuses it; before authentication only ApiVersions and the SASL APIs may pass.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from kipside.protocol import ApiKey
from kipside.proxy.core.decisions import (
    FORWARD_OWN_RAW,
    Answer,
    ClientHandle,
    ClientRequest,
    Close,
    Decision,
)
from kipside.proxy.security.client_sasl import ClientSasl, SaslStep
from kipside.proxy.security.sasl_messages import SASL_APIS

__all__ = ["RAW_TOKEN_REPLY", "SaslStage", "raw_token"]

RAW_TOKEN_REPLY: Final = (ApiKey.SASL_AUTHENTICATE, 0)
"""The API and version kipside's answer to a raw token is owed as (it has no correlation id)."""


class SaslClient(ClientHandle, Protocol):
    """A client handle with its SASL state."""

    sasl: ClientSasl


class SaslStage:
    """Where a request's SASL is decided: the first stage. It sees every request while kipside
    terminates SASL (none may pass before authentication), else only the SASL APIs."""

    def __init__(self, terminates: bool = False) -> None:
        self.api_keys: frozenset[int] | None = None if terminates else SASL_APIS

    def __call__(self, request: ClientRequest) -> Decision | None:
        client: SaslClient = request.client  # type: ignore[assignment]
        sasl = client.sasl
        api_key = request.header.api_key
        if api_key not in SASL_APIS and not sasl.terminates:
            return None
        if not sasl.terminates:
            client.authenticated = True  # its SASL goes to the broker on its own connection
            forwarding = sasl.forwarding(request.frame, request.header)
            if forwarding.answer is None and forwarding.close is None:
                return None
            return _decided(client, forwarding)
        step = sasl.before_authentication(request.header)
        if step is None and api_key in SASL_APIS:
            step = sasl.answer(request.frame, request.header)
        return None if step is None else _decided(client, step)


def raw_token(client: SaslClient, frame: bytes) -> Decision:
    """A legacy SASL token (after SaslHandshake v0): answered here, or carried as it is."""
    sasl = client.sasl
    if sasl.terminates:
        return _decided(client, sasl.raw_token(frame))
    sasl.raw_token_forwarded()
    return FORWARD_OWN_RAW


def _decided(client: SaslClient, step: SaslStep) -> Decision:
    """kipside's answer (owed in request order), the principal the client proved, or why it is
    refused: the answer is owed first, then the connection closes."""
    if step.principal is not None:
        client.authenticated_as(step.principal)
    if step.close is not None:
        return Close(step.close, logging.WARNING, answer=step.answer)
    assert step.answer is not None
    return Answer(step.answer)
