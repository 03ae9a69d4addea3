"""SASL as Kafka speaks it, sans-I/O: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, 7677).

One object per exchange, on either side. A server (`PlainServer`, `ScramServer`) is fed the
client's tokens with `step(token)` and returns the token to answer with; once `complete` is set,
`username` is who the client proved to be. A client (`PlainClient`, `ScramClient`) gives its
first token with `first()` and answers each server token with `step(token)`, returning None once
the exchange is over (and the server proved it knows the credentials, for SCRAM). Tokens are
the bytes Kafka carries in SaslAuthenticate (or, after SaslHandshake v0, as raw frames).

A server never sees a password at rest: it checks against `ScramCredential`s (salt, iteration
count, StoredKey, ServerKey; RFC 5802 section 3), which is all a credentials file holds. PLAIN is
checked by deriving the StoredKey of the password the client sent with the stored salt and
iteration count. Kafka's SCRAM does no SASLprep: names and passwords are used as UTF-8, and only
',' and '=' in a SCRAM user name are escaped (=2C, =3D).

Errors split as h11's do: `AuthenticationFailed` (the peer's credentials are wrong) and
`SaslProtocolError` (the peer's token is malformed) are the peer's doing; their messages are safe
to log and to send back: they never hold a password, a proof or a key. This module never does
I/O and never logs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
SCRAM_MECHANISMS: Final = (SCRAM_SHA_256, SCRAM_SHA_512)
SASL_MECHANISMS: Final = (PLAIN, *SCRAM_MECHANISMS)
SASL_ROUND_TRIPS: Final = {PLAIN: 1, SCRAM_SHA_256: 2, SCRAM_SHA_512: 2}
"""Token round trips of a successful exchange: after SaslHandshake v0 this many raw frames
follow in each direction before Kafka framing resumes."""

# Apache Kafka's bounds for SCRAM iterations (ScramMechanism.minIterations / maxIterations).
SCRAM_MIN_ITERATIONS: Final = 4096
SCRAM_MAX_ITERATIONS: Final = 16384
SCRAM_DEFAULT_ITERATIONS: Final = 4096
SASL_MAX_TOKEN_BYTES: Final = 64 * 1024
"""No PLAIN or SCRAM token is near this; anything larger is refused unread."""

_HASHES: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
_GS2_HEADER: Final = "n,,"


class SaslError(Exception):
    """The exchange failed; the message is safe to log and to show the peer."""


class AuthenticationFailed(SaslError):
    """The peer's credentials are wrong (unknown user, wrong password, bad proof)."""


class SaslProtocolError(SaslError):
    """The peer's token does not follow the mechanism."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server stores for one user and one SCRAM mechanism (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


CredentialLookup = Callable[[str, str], ScramCredential | None]
"""(username, mechanism) -> the user's stored credential for that SCRAM mechanism, or None."""


def _hash(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise SaslProtocolError(f"{mechanism!r} is not a SCRAM mechanism") from None


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, _hash(mechanism)).digest()


def _h(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(_hash(mechanism), data).digest()


def _salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


def scram_credential(
    mechanism: str,
    password: str,
    *,
    salt: bytes | None = None,
    iterations: int = SCRAM_DEFAULT_ITERATIONS,
) -> ScramCredential:
    """The credential a server stores for `password` (a fresh random salt unless given)."""
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be between {SCRAM_MIN_ITERATIONS} and {SCRAM_MAX_ITERATIONS} "
            "(Apache Kafka's bounds)"
        )
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = _salted_password(mechanism, password, salt, iterations)
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(
        mechanism,
        salt,
        iterations,
        _h(mechanism, client_key),
        _hmac(mechanism, salted, b"Server Key"),
    )


def _check_token(token: bytes) -> str:
    if len(token) > SASL_MAX_TOKEN_BYTES:
        raise SaslProtocolError(f"token of {len(token)} bytes is over {SASL_MAX_TOKEN_BYTES}")
    try:
        return token.decode()
    except UnicodeDecodeError:
        raise SaslProtocolError("token is not UTF-8") from None


def _attributes(message: str, what: str) -> dict[str, str]:
    """A SCRAM message's attributes ("r=...,s=..."): each key once, values unescaped later."""
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise SaslProtocolError(f"malformed SCRAM {what}: attribute {key[:20]!r}")
        out.setdefault(key, value)
    return out


def _username(escaped: str) -> str:
    # RFC 5802 5.1: ',' and '=' are sent as =2C and =3D; any other '=' is malformed.
    if "=" in escaped.replace("=2C", "").replace("=3D", ""):
        raise SaslProtocolError("malformed SCRAM user name")
    return escaped.replace("=2C", ",").replace("=3D", "=")


def _escape(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslProtocolError(f"SCRAM {what} is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Servers ----------------------------------------------------------------------------------


class PlainServer:
    """The server side of SASL/PLAIN, checked against stored SCRAM credentials."""

    mechanism: Final = PLAIN

    def __init__(self, lookup: CredentialLookup) -> None:
        self._lookup = lookup
        self.complete = False
        self.username: str | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslProtocolError("PLAIN takes one token; the exchange is over")
        parts = _check_token(token).split("\0")
        if len(parts) != 3:
            raise SaslProtocolError("PLAIN token is not authzid NUL username NUL password")
        authzid, username, password = parts
        if not username:
            raise SaslProtocolError("PLAIN token has an empty user name")
        if authzid and authzid != username:
            raise AuthenticationFailed(
                f"user {username!r} asked to act as {authzid!r}; an authorization id other "
                "than the user name is not allowed"
            )
        for mechanism in (SCRAM_SHA_512, SCRAM_SHA_256):
            stored = self._lookup(username, mechanism)
            if stored is not None:
                break
        else:
            raise AuthenticationFailed(f"unknown user {username!r}")
        derived = scram_credential(
            stored.mechanism, password, salt=stored.salt, iterations=stored.iterations
        )
        if not hmac.compare_digest(derived.stored_key, stored.stored_key):
            raise AuthenticationFailed(f"wrong password for user {username!r}")
        self.complete = True
        self.username = username
        return b""


class ScramServer:
    """The server side of SCRAM-SHA-256/512 (two round trips)."""

    def __init__(
        self, mechanism: str, lookup: CredentialLookup, *, nonce: str | None = None
    ) -> None:
        _hash(mechanism)
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = nonce or secrets.token_urlsafe(24)
        self.complete = False
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._gs2 = _GS2_HEADER
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def step(self, token: bytes) -> bytes:
        text = _check_token(token)
        if self.complete:
            raise SaslProtocolError(f"{self.mechanism} takes two tokens; the exchange is over")
        if self._credential is None:
            return self._client_first(text)
        return self._client_final(text)

    def _client_first(self, text: str) -> bytes:
        gs2, sep, bare = text.partition(",,")
        if not sep or (gs2 not in ("n", "y") and not gs2.startswith(("n,a=", "y,a="))):
            if gs2.startswith("p"):
                raise SaslProtocolError("SCRAM channel binding is not supported")
            raise SaslProtocolError("malformed SCRAM client-first message (GS2 header)")
        attributes = _attributes(bare, "client-first message")
        if "n" not in attributes or "r" not in attributes or not attributes["r"]:
            raise SaslProtocolError("SCRAM client-first message lacks n= or r=")
        username = _username(attributes["n"])
        authzid = gs2.partition("a=")[2]
        if authzid and _username(authzid) != username:
            raise AuthenticationFailed(
                f"user {username!r} asked to act as {authzid!r}; an authorization id other "
                "than the user name is not allowed"
            )
        credential = self._lookup(username, self.mechanism)
        if credential is None:
            raise AuthenticationFailed(f"unknown user {username!r} for {self.mechanism}")
        self._credential = credential
        self.username = username
        self._gs2 = gs2 + ",,"
        self._first_bare = bare
        self._nonce = attributes["r"] + self._server_nonce
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        assert self._credential is not None
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep:
            raise SaslProtocolError("SCRAM client-final message has no proof (p=)")
        attributes = _attributes(without_proof, "client-final message")
        if _b64decode(attributes.get("c", ""), "channel binding") != self._gs2.encode():
            raise SaslProtocolError("SCRAM client-final message has the wrong channel binding")
        if attributes.get("r") != self._nonce:
            raise SaslProtocolError("SCRAM client-final message has the wrong nonce")
        proof = _b64decode(proof_text, "proof")
        credential = self._credential
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslProtocolError("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(_h(self.mechanism, client_key), credential.stored_key):
            raise AuthenticationFailed(f"wrong password for user {self.username!r}")
        self.complete = True
        server_signature = _hmac(self.mechanism, credential.server_key, auth_message)
        return f"v={_b64(server_signature)}".encode()


SaslServer = PlainServer | ScramServer


def new_server(mechanism: str, lookup: CredentialLookup) -> SaslServer:
    """The server for `mechanism`; SaslProtocolError names the mechanisms there are."""
    if mechanism == PLAIN:
        return PlainServer(lookup)
    if mechanism in SCRAM_MECHANISMS:
        return ScramServer(mechanism, lookup)
    raise SaslProtocolError(
        f"mechanism {mechanism!r} is not supported; use one of {', '.join(SASL_MECHANISMS)}"
    )


# Clients ----------------------------------------------------------------------------------


class PlainClient:
    """The client side of SASL/PLAIN."""

    mechanism: Final = PLAIN

    def __init__(self, username: str, password: str) -> None:
        self.username = username
        self._password = password
        self.complete = False

    def __repr__(self) -> str:
        return f"PlainClient(username={self.username!r})"

    def first(self) -> bytes:
        return f"\0{self.username}\0{self._password}".encode()

    def step(self, token: bytes) -> bytes | None:
        self.complete = True
        return None


class ScramClient:
    """The client side of SCRAM-SHA-256/512: verifies the server's signature at the end."""

    def __init__(
        self, mechanism: str, username: str, password: str, *, nonce: str | None = None
    ) -> None:
        _hash(mechanism)
        self.mechanism = mechanism
        self.username = username
        self._password = password
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_escape(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self.complete = False

    def __repr__(self) -> str:
        return f"ScramClient({self.mechanism!r}, username={self.username!r})"

    def first(self) -> bytes:
        return (_GS2_HEADER + self._first_bare).encode()

    def step(self, token: bytes) -> bytes | None:
        text = _check_token(token)
        attributes = _attributes(text, "server message")
        if "e" in attributes:
            raise AuthenticationFailed(f"the server refused: {attributes['e'][:200]}")
        if self._server_signature is None:
            return self._server_first(text, attributes)
        if _b64decode(attributes.get("v", ""), "server signature") != self._server_signature:
            raise AuthenticationFailed("the server's SCRAM signature is wrong")
        self.complete = True
        return None

    def _server_first(self, text: str, attributes: dict[str, str]) -> bytes:
        nonce = attributes.get("r", "")
        if not nonce.startswith(self._nonce) or nonce == self._nonce:
            raise SaslProtocolError("SCRAM server nonce does not extend the client's")
        try:
            iterations = int(attributes.get("i", ""))
        except ValueError:
            raise SaslProtocolError("SCRAM server-first message has no iteration count") from None
        if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
            raise SaslProtocolError(f"SCRAM iteration count {iterations} is out of bounds")
        salt = _b64decode(attributes.get("s", ""), "salt")
        salted = _salted_password(self.mechanism, self._password, salt, iterations)
        client_key = _hmac(self.mechanism, salted, b"Client Key")
        without_proof = f"c={_b64(_GS2_HEADER.encode())},r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = _hmac(self.mechanism, _h(self.mechanism, client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = _hmac(self.mechanism, salted, b"Server Key")
        self._server_signature = _hmac(self.mechanism, server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()


SaslClient = PlainClient | ScramClient


def new_client(mechanism: str, username: str, password: str) -> SaslClient:
    """The client for `mechanism`; SaslProtocolError names the mechanisms there are."""
    if mechanism == PLAIN:
        return PlainClient(username, password)
    if mechanism in SCRAM_MECHANISMS:
        return ScramClient(mechanism, username, password)
    raise SaslProtocolError(
        f"mechanism {mechanism!r} is not supported; use one of {', '.join(SASL_MECHANISMS)}"
    )
