"""SaslRelay: a simulation of a SASL_PLAINTEXT Kafka listener, in front of a Tansu that has none.

Tansu 0.6.0 authenticates nobody, so this relay plays the SASL server Apache Kafka runs on a
SASL listener, with the users and passwords the test gives it:

- ApiVersions is answered by the broker, with SaslHandshake v0-1 and SaslAuthenticate v0-2
  added; with `legacy=True` it offers only the pre-Kafka-1.0 flow: SaslHandshake v0 and no
  SaslAuthenticate, so clients send the tokens that follow as raw size-prefixed frames and get
  raw frames back (no Kafka header, no correlation id).
- SaslHandshake and SaslAuthenticate (or the raw tokens) are answered here: PLAIN checked
  against the password, SCRAM-SHA-256/512 by scramp (an implementation independent of
  kipside's). A failed SaslAuthenticate gets SASL_AUTHENTICATION_FAILED and the connection
  then closes; a failed raw exchange closes the connection at once, as Kafka does.
- Before authentication only ApiVersions and the SASL APIs are allowed; anything else closes
  the connection (Kafka's "Unexpected Kafka request ... during SASL handshake"), recorded.

Per connection it records who authenticated and what the connection carried afterwards (API
keys, client ids, topics, producer ids, transactional ids), the producer ids the broker granted
on it (InitProducerId answers), each ProduceRequest's producer ids and each transaction
request's transactional id, so a test can show which identity each upstream connection of
kipside's used, that two identities never shared one, and that no single request carried two
identities' batches or registrations.
"""

from __future__ import annotations

import dataclasses
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import scramp

from kipside.protocol.apis import ApiKey
from kipside.protocol.headers import parse_response_header
from kipside.protocol.messages import (
    build,
    decode_request,
    decode_response,
    encode_message,
    response_class,
)
from kipside.protocol.produce import parse_produce_request
from kipside.protocol.records import iter_batches

from .base import Relay, response_frame
from .decisions import CLOSE, FORWARD, Answer, Conn, Decision, Request

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
SASL_AUTHENTICATION_FAILED = 58
# Requests that name a transactional id, and where (all top-level in the versions clients use).
TRANSACTIONAL_APIS = frozenset(
    {
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.TXN_OFFSET_COMMIT,
    }
)


@dataclass(slots=True)
class Carried:
    """One connection to the relay: who authenticated on it and what it carried then."""

    number: int
    user: str | None = None
    mechanism: str | None = None
    handshake_version: int | None = None
    failed_logins: int = 0
    apis: Counter[int] = field(default_factory=Counter)
    client_ids: set[str] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    producer_ids: set[int] = field(default_factory=set)
    transactional_ids: set[str] = field(default_factory=set)
    mixed_produce_requests: int = 0
    """ProduceRequests carrying batches of two or more producers (coalesced by a proxy)."""
    granted_producer_ids: set[int] = field(default_factory=set)
    """Producer ids the broker's InitProducerId answers gave on this connection."""
    produce_requests: list[frozenset[int]] = field(default_factory=list)
    """Each ProduceRequest's producer ids, in arrival order."""
    transaction_requests: list[tuple[str, str, str]] = field(default_factory=list)
    """(API name, transactional id, client id) of each transaction request, in order."""
    refused: list[str] = field(default_factory=list)
    """Requests refused before authentication (the connection closed at the first)."""

    def copy(self) -> Carried:
        return dataclasses.replace(
            self,
            apis=Counter(self.apis),
            client_ids=set(self.client_ids),
            topics=set(self.topics),
            producer_ids=set(self.producer_ids),
            transactional_ids=set(self.transactional_ids),
            granted_producer_ids=set(self.granted_producer_ids),
            produce_requests=list(self.produce_requests),
            transaction_requests=list(self.transaction_requests),
            refused=list(self.refused),
        )


@dataclass(slots=True)
class _Login:
    """The SASL state of one connection (relay thread only)."""

    mechanism: str | None = None
    handshake_version: int = 1
    scram: Any = None  # a scramp ScramServer while a SCRAM exchange runs
    tokens: int = 0  # tokens received in this exchange
    raw: bool = False  # the next client frame is a raw token (after SaslHandshake v0)
    claimed: str = ""  # the SCRAM user name the client gave
    user: str | None = None
    failed: bool = False


class SaslRelay(Relay):
    """A SASL-enforcing listener on 127.0.0.1:0 in front of one broker (see the module doc)."""

    def __init__(
        self,
        users: dict[str, str],
        *,
        legacy: bool = False,
        mechanisms: tuple[str, ...] = MECHANISMS,
        upstream: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(upstream)
        self.users = dict(users)
        self.legacy = legacy
        self.mechanisms = mechanisms
        self._auth_info = {
            (user, mechanism): scramp.ScramMechanism(mechanism).make_auth_info(password)
            for user, password in users.items()
            for mechanism in MECHANISMS[1:]
        }
        self._logins: dict[int, _Login] = {}
        self._carried: dict[int, Carried] = {}

    # What the test reads (test thread) ---------------------------------------------------

    def carried(self) -> list[Carried]:
        """Every connection so far, in accepting order."""
        with self._lock:
            return [c.copy() for c in self._carried.values()]

    def authenticated(self) -> list[Carried]:
        """The connections on which someone authenticated."""
        return [c for c in self.carried() if c.user is not None]

    # Hooks (relay thread) ------------------------------------------------------------------

    def on_open(self, conn: Conn) -> None:
        self._logins[conn.number] = _Login()
        with self._lock:
            self._carried[conn.number] = Carried(conn.number)

    def on_close(self, conn: Conn) -> None:
        self._logins.pop(conn.number, None)

    def on_request(self, conn: Conn, request: Request) -> Decision:
        login = self._logins[conn.number]
        header = request.header
        if header.api_key == ApiKey.API_VERSIONS:
            return FORWARD
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(login, request)
        if header.api_key == ApiKey.SASL_AUTHENTICATE:
            if self.legacy or login.failed:
                return CLOSE
            return self._authenticate(conn, login, request)
        if login.user is None:
            with self._lock:
                self._carried[conn.number].refused.append(ApiKey(header.api_key).name)
            return CLOSE
        self._record(conn, request)
        return FORWARD

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        if request.header.api_key == ApiKey.INIT_PRODUCER_ID:
            self._granted(conn, request, frame)
        if request.header.api_key != ApiKey.API_VERSIONS:
            return frame
        version = request.header.api_version
        head = parse_response_header(frame, ApiKey.API_VERSIONS, version)
        message = decode_response(ApiKey.API_VERSIONS, version, frame, head.body_offset)
        if message.error_code != 0:
            return frame
        offered = {ApiKey.SASL_HANDSHAKE: (0, 0 if self.legacy else 1)}
        if not self.legacy:
            offered[ApiKey.SASL_AUTHENTICATE] = (0, 2)
        entry = type(message.api_keys[0])
        keys = [k for k in message.api_keys if k.api_key not in SASL_KEYS]
        keys += [
            build(entry, {"api_key": key, "min_version": low, "max_version": high})
            for key, (low, high) in offered.items()
        ]
        message = dataclasses.replace(message, api_keys=tuple(keys))
        return _reframe(frame, head, message)

    def takes_raw_frame(self, conn: Conn) -> bool:
        login = self._logins.get(conn.number)
        return login is not None and login.raw

    def on_raw_frame(self, conn: Conn, frame: bytes) -> bytes | None:
        login = self._logins[conn.number]
        answer = self._step(conn, login, frame[4:])
        if answer is None:
            return None
        if login.user is not None:
            login.raw = False  # back to Kafka framing
        return struct.pack(">i", len(answer)) + answer

    # SASL (relay thread) ---------------------------------------------------------------------

    def _handshake(self, login: _Login, request: Request) -> Decision:
        header = request.header
        message = decode_request(
            ApiKey.SASL_HANDSHAKE, header.api_version, request.frame, header.body_offset
        )
        error = 0
        if self.legacy and header.api_version > 0:
            error = UNSUPPORTED_VERSION
        elif message.mechanism not in self.mechanisms or login.mechanism is not None:
            error = UNSUPPORTED_SASL_MECHANISM if login.mechanism is None else ILLEGAL_SASL_STATE
        else:
            login.mechanism = message.mechanism
            login.handshake_version = header.api_version
            login.raw = header.api_version == 0
        fields = {"error_code": error, "mechanisms": list(self.mechanisms)}
        return self._answer(request, fields)

    def _authenticate(self, conn: Conn, login: _Login, request: Request) -> Decision:
        header = request.header
        if login.mechanism is None or login.user is not None:
            return self._answer(
                request,
                {"error_code": ILLEGAL_SASL_STATE, "auth_bytes": b"", "error_message": None},
            )
        message = decode_request(
            ApiKey.SASL_AUTHENTICATE, header.api_version, request.frame, header.body_offset
        )
        answer = self._step(conn, login, message.auth_bytes)
        if answer is None:
            login.failed = True
            return self._answer(
                request,
                {
                    "error_code": SASL_AUTHENTICATION_FAILED,
                    "error_message": "Authentication failed: Invalid username or password",
                    "auth_bytes": b"",
                },
            )
        return self._answer(
            request,
            {"error_code": 0, "error_message": None, "auth_bytes": answer, "session_lifetime": 0},
        )

    def _step(self, conn: Conn, login: _Login, token: bytes) -> bytes | None:
        """The server's answer to one client token; None when authentication failed."""
        login.tokens += 1
        try:
            if login.mechanism == "PLAIN":
                _authzid, user, password = token.decode().split("\0")
                if self.users.get(user) != password:
                    raise ValueError("wrong password")
                self._authenticated(conn, login, user)
                return b""
            if login.tokens == 1:

                def credentials(user: str) -> tuple[bytes, bytes, bytes, int]:
                    login.claimed = user  # scramp keeps no user name
                    salt, stored_key, server_key, iterations = self._auth_info[
                        (user, str(login.mechanism))
                    ]
                    return bytes(salt), bytes(stored_key), bytes(server_key), int(iterations)

                login.scram = scramp.ScramMechanism(login.mechanism).make_server(credentials)
                login.scram.set_client_first(token.decode())
                return str(login.scram.get_server_first()).encode()
            login.scram.set_client_final(token.decode())
            self._authenticated(conn, login, login.claimed)
            return str(login.scram.get_server_final()).encode()
        except (ValueError, KeyError, scramp.ScramException):
            with self._lock:
                self._carried[conn.number].failed_logins += 1
            return None

    def _authenticated(self, conn: Conn, login: _Login, user: str) -> None:
        login.user = user
        with self._lock:
            carried = self._carried[conn.number]
            carried.user, carried.mechanism = user, login.mechanism
            carried.handshake_version = login.handshake_version

    def _answer(self, request: Request, fields: dict[str, Any]) -> Answer:
        header = request.header
        message = build(response_class(header.api_key, header.api_version), fields)
        return Answer(response_frame(header, encode_message(message)))

    def _granted(self, conn: Conn, request: Request, frame: bytes) -> None:
        version = request.header.api_version
        head = parse_response_header(frame, ApiKey.INIT_PRODUCER_ID, version)
        answer = decode_response(ApiKey.INIT_PRODUCER_ID, version, frame, head.body_offset)
        if answer.error_code == 0:
            with self._lock:
                self._carried[conn.number].granted_producer_ids.add(int(answer.producer_id))

    def _record(self, conn: Conn, request: Request) -> None:
        header = request.header
        topics: set[str] = set()
        producer_ids: set[int] = set()
        transactional_id = None
        if header.api_key == ApiKey.PRODUCE and header.api_version >= 3:
            produce = parse_produce_request(request.frame, header.body_offset, header.api_version)
            transactional_id = produce.transactional_id
            for partition in produce.partitions:
                topics.add(partition.topic)
                if partition.records is not None:
                    producer_ids.update(b.producer_id for b in iter_batches(partition.records))
        elif header.api_key in TRANSACTIONAL_APIS:
            message = decode_request(
                header.api_key, header.api_version, request.frame, header.body_offset
            )
            transactional_id = getattr(message, "transactional_id", None) or getattr(
                message, "v3_and_below_transactional_id", None
            )
        with self._lock:
            carried = self._carried[conn.number]
            carried.apis[header.api_key] += 1
            if header.client_id:
                carried.client_ids.add(header.client_id)
            carried.topics |= topics
            carried.producer_ids |= producer_ids - {-1}
            carried.mixed_produce_requests += len(producer_ids - {-1}) > 1
            if header.api_key == ApiKey.PRODUCE:
                carried.produce_requests.append(frozenset(producer_ids - {-1}))
            if transactional_id:
                carried.transactional_ids.add(transactional_id)
            if header.api_key in TRANSACTIONAL_APIS and transactional_id:
                name = ApiKey(header.api_key).name
                carried.transaction_requests.append(
                    (name, transactional_id, header.client_id or "")
                )


SASL_KEYS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


def _reframe(frame: bytes, head: Any, message: Any) -> bytes:
    """The response frame with its body replaced by `message` (header kept as it was)."""
    header = frame[4 : head.body_offset]
    body = encode_message(message)
    return struct.pack(">i", len(header) + len(body)) + header + body
