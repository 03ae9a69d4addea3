"""One client connection's SASL: carried to the broker (passthrough) or answered here.

Passthrough (the default): the client's SaslHandshake and SaslAuthenticate go to the broker on
the client's own upstream connection. Only SaslHandshake v0 needs kipside's attention: once the
broker accepts one, the client's next frames are raw tokens (no Kafka header) and so are the
broker's answers, one round trip for PLAIN and two for SCRAM, after which Kafka framing resumes.
`ClientSasl` counts them so the session carries them opaque and in order. A legacy exchange of
a mechanism whose length kipside can't know (GSSAPI, OAUTHBEARER) is refused at the handshake
with UNSUPPORTED_SASL_MECHANISM and a log line, rather than carried and then misread.

Termination (`--sasl-credentials`): kipside is the SASL server. It answers SaslHandshake v0/v1,
SaslAuthenticate v0-2 and legacy raw tokens with PLAIN and SCRAM-SHA-256/512 against the
credentials file; before authentication only ApiVersions and the SASL APIs are allowed, and
anything else closes the connection with a log line, as Apache Kafka does. A client who proves
who they are becomes `User:NAME`; one whose principal has no upstream login is refused.

Never logs, returns or raises a password or any other secret: failure texts come from
kipside.protocol's SASL errors, which hold user names and mechanisms only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kipside.protocol import (
    SASL_MECHANISMS,
    SASL_ROUND_TRIPS,
    ApiKey,
    CredentialLookup,
    DecodeError,
    ErrorCode,
    RequestHeader,
    SaslError,
    SaslServer,
    api_name,
    new_server,
)
from kipside.proxy.core.identity import Principal
from kipside.proxy.security.sasl_messages import (
    authenticate_answer,
    authenticate_token,
    handshake_accepted,
    handshake_answer,
    handshake_mechanism,
    raw_frame,
)

# What Apache Kafka answers a client whose SASL authentication failed: SaslServerAuthenticator's
# words for SCRAM, PlainSaslServer's own for PLAIN.
FAILED_MESSAGE = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
)
PLAIN_FAILED_MESSAGE = "Authentication failed: Invalid username or password"


def failed_message(mechanism: str) -> str:
    """Apache Kafka's error message for a failed login with `mechanism`."""
    return PLAIN_FAILED_MESSAGE if mechanism == "PLAIN" else FAILED_MESSAGE.format(mechanism)


class NoUpstreamLogin(SaslError):
    """The client authenticated, but kipside has no login to the brokers for its principal."""


@dataclass(frozen=True, slots=True)
class SaslStep:
    """What the session does with a SASL request or raw token.

    Nothing set: forward it on the client's own connection (passthrough). `answer`: owe the
    client this frame. `close`: then close the connection, logging this reason. `principal`:
    the client has just authenticated as this principal.
    """

    answer: bytes | None = None
    close: str | None = None
    principal: Principal | None = None


FORWARD = SaslStep()


@dataclass(frozen=True, slots=True)
class Termination:
    """What kipside needs to be the SASL server: the credentials, and who may go upstream."""

    lookup: CredentialLookup
    can_go_upstream: Callable[[Principal], bool]
    credentials_source: str
    upstream_source: str | None


class ClientSasl:
    """The SASL state of one client connection (see the module doc)."""

    def __init__(self, termination: Termination | None = None) -> None:
        self.termination = termination
        self.principal: Principal | None = None
        """Set once the client authenticated to kipside (termination only)."""
        self.raw_token_due = False
        """Whether the client's next frame is a raw token, not a Kafka request (read per
        frame, so a plain attribute)."""
        self._legacy_mechanism: str | None = None
        self._raw_due = 0
        self._server: SaslServer | None = None
        self._handshake_version = 1

    @property
    def terminates(self) -> bool:
        return self.termination is not None

    # Passthrough ---------------------------------------------------------------------------

    def forwarding(self, frame: bytes, header: RequestHeader) -> SaslStep:
        """A SASL request about to be carried to the broker (passthrough)."""
        if header.api_key != ApiKey.SASL_HANDSHAKE or header.api_version != 0:
            return FORWARD
        try:
            mechanism = handshake_mechanism(frame, header)
        except DecodeError as exc:
            return SaslStep(close=f"sent a malformed SaslHandshake v0 ({exc})")
        if mechanism not in SASL_ROUND_TRIPS:
            carried = ", ".join(SASL_ROUND_TRIPS)
            return SaslStep(
                answer=handshake_answer(
                    header, ErrorCode.unsupported_sasl_mechanism, tuple(SASL_ROUND_TRIPS)
                ),
                close=f"asked for SASL {mechanism} with SaslHandshake v0; kipside carries legacy "
                f"(v0) SASL tokens only for {carried}: use a client that sends SaslAuthenticate "
                "(Kafka 1.0+), which kipside carries for every mechanism",
            )
        self._legacy_mechanism = mechanism
        return FORWARD

    def broker_answered(self, api_key: int, api_version: int, frame: bytes) -> None:
        """The broker's answer to a forwarded request, before it reaches the client."""
        if api_key != ApiKey.SASL_HANDSHAKE or api_version != 0:
            return
        mechanism, self._legacy_mechanism = self._legacy_mechanism, None
        if mechanism is not None and handshake_accepted(frame):
            self._raw_due = SASL_ROUND_TRIPS[mechanism]
            self.raw_token_due = True

    def raw_token_forwarded(self) -> None:
        self._raw_due -= 1
        self.raw_token_due = self._raw_due > 0

    # Termination -------------------------------------------------------------------------

    def before_authentication(self, header: RequestHeader) -> SaslStep | None:
        """None if the request may go on; else how to answer it (termination only)."""
        if self.termination is None or self.principal is not None:
            return None
        if header.api_key == ApiKey.API_VERSIONS:
            return None
        if header.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            return None  # answer() takes them
        return SaslStep(
            close=f"sent {api_name(header.api_key)} before authenticating; kipside requires "
            "SASL here (--sasl-credentials): set the client's security.protocol to "
            "SASL_PLAINTEXT or SASL_SSL and its sasl.mechanism to one of "
            + ", ".join(SASL_MECHANISMS)
        )

    def answer(self, frame: bytes, header: RequestHeader) -> SaslStep:
        """kipside's answer to SaslHandshake or SaslAuthenticate (termination only)."""
        assert self.termination is not None
        try:
            if header.api_key == ApiKey.SASL_HANDSHAKE:
                return self._handshake(frame, header)
            token = authenticate_token(frame, header)
        except DecodeError as exc:
            return SaslStep(close=f"sent a malformed {api_name(header.api_key)} ({exc})")
        if self._server is None or self._handshake_version == 0 or self.principal is not None:
            return SaslStep(
                answer=authenticate_answer(
                    header, b"", ErrorCode.illegal_sasl_state, "SaslAuthenticate out of order"
                ),
                close="sent SaslAuthenticate without a SaslHandshake v1 before it",
            )
        try:
            reply, principal = self._step(token)
        except SaslError as exc:
            mechanism = self._server.mechanism
            shown = failed_message(mechanism)
            if isinstance(exc, NoUpstreamLogin):
                shown = f"kipside has no login to the brokers for {exc.args[1]}"
            return SaslStep(
                answer=authenticate_answer(
                    header, b"", ErrorCode.sasl_authentication_failed, shown
                ),
                close=f"SASL {mechanism} authentication failed: {exc.args[0]}",
            )
        return SaslStep(answer=authenticate_answer(header, reply), principal=principal)

    def raw_token(self, frame: bytes) -> SaslStep:
        """A legacy raw token, answered by kipside (termination only)."""
        assert self._server is not None
        try:
            reply, principal = self._step(frame[4:])
        except SaslError as exc:
            self.raw_token_due = False
            # Apache Kafka closes the connection: the legacy flow has no error frame.
            mechanism = self._server.mechanism
            return SaslStep(close=f"SASL {mechanism} authentication failed: {exc.args[0]}")
        return SaslStep(answer=raw_frame(reply), principal=principal)

    def _handshake(self, frame: bytes, header: RequestHeader) -> SaslStep:
        mechanism = handshake_mechanism(frame, header)
        assert self.termination is not None
        if self._server is not None:
            answer = handshake_answer(header, ErrorCode.illegal_sasl_state, SASL_MECHANISMS)
            return SaslStep(answer=answer, close="sent a second SaslHandshake")
        if mechanism not in SASL_MECHANISMS:
            answer = handshake_answer(header, ErrorCode.unsupported_sasl_mechanism, SASL_MECHANISMS)
            return SaslStep(
                answer=answer,
                close=f"asked for SASL mechanism {mechanism!r}; kipside offers "
                + ", ".join(SASL_MECHANISMS),
            )
        self._server = new_server(mechanism, self.termination.lookup)
        self._handshake_version = header.api_version
        self.raw_token_due = header.api_version == 0
        return SaslStep(answer=handshake_answer(header, ErrorCode.none, SASL_MECHANISMS))

    def _step(self, token: bytes) -> tuple[bytes, Principal | None]:
        """The server's reply to one token, and the principal once complete. Raises SaslError."""
        assert self._server is not None and self.termination is not None
        reply = self._server.step(token)
        if not self._server.complete:
            return reply, None
        self.raw_token_due = False
        principal = Principal(f"User:{self._server.username}", "sasl")
        if not self.termination.can_go_upstream(principal):
            raise NoUpstreamLogin(
                f"{principal} has no upstream login in "
                f"{self.termination.upstream_source or '(no --sasl-upstream file)'}; add one "
                "under principals there, so kipside can log in to the brokers for it",
                principal,
            )
        self.principal = principal
        return reply, principal
