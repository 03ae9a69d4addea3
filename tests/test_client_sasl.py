"""ClientSasl in memory: a client's request frames in, SaslSteps out, their answers decoded back.

The way h11 tests its Connection: real Kafka frames built with kipside.protocol's encoders go in
(SaslHandshake v0/v1, SaslAuthenticate v0-2, legacy raw tokens, ApiVersions, Metadata,
Produce), and what ClientSasl says is checked as bytes a Kafka client would read. Both modes:
passthrough (the broker authenticates; kipside only counts the raw tokens after a SaslHandshake
v0) and termination (kipside is the SASL server for PLAIN and SCRAM-SHA-256/512). The SCRAM
client side is scramp, an independent implementation, and kipside.protocol's own client.
No socket, no trio.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import pytest
import scramp

from kipside.protocol import (
    INT32,
    PLAIN,
    SASL_MECHANISMS,
    SASL_ROUND_TRIPS,
    SCRAM_MECHANISMS,
    ApiKey,
    ErrorCode,
    PartitionBatch,
    ScramCredential,
    build_frame,
    decode_response,
    encode_message,
    encode_produce_request,
    encode_request_header,
    new_client,
    parse_request_header,
    parse_response_header,
    request_class,
    response_class,
    response_frame,
    scram_credential,
)
from kipside.proxy.core.identity import Principal
from kipside.proxy.security.client_sasl import (
    FORWARD,
    ClientSasl,
    SaslStep,
    Termination,
    failed_message,
)
from kipside.proxy.security.sasl_messages import SASL_APIS

SCRAM_SHA_256, SCRAM_SHA_512 = SCRAM_MECHANISMS
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
CREDENTIALS: dict[tuple[str, str], ScramCredential] = {
    (user, mechanism): scram_credential(mechanism, password)
    for user, password in PASSWORDS.items()
    for mechanism in SCRAM_MECHANISMS
}
UPSTREAM = frozenset({"User:alice", "User:bob"})  # carol can log in, but has no upstream login


def termination(upstream_source: str | None = "upstream.yaml") -> Termination:
    return Termination(
        lookup=lambda user, mechanism: CREDENTIALS.get((user, mechanism)),
        can_go_upstream=lambda principal: principal.name in UPSTREAM,
        credentials_source="creds.yaml",
        upstream_source=upstream_source,
    )


# Frames a client sends ------------------------------------------------------------------------


def request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    body = encode_message(request_class(api_key, version)(**fields))
    return build_frame(encode_request_header(api_key, version, correlation_id, "tests"), body)


def handshake(mechanism: str, version: int = 1, correlation_id: int = 1) -> bytes:
    return request(ApiKey.SASL_HANDSHAKE, version, correlation_id, mechanism=mechanism)


def authenticate(token: bytes, version: int = 1, correlation_id: int = 2) -> bytes:
    return request(ApiKey.SASL_AUTHENTICATE, version, correlation_id, auth_bytes=token)


def api_versions(correlation_id: int = 0) -> bytes:
    return request(
        ApiKey.API_VERSIONS,
        3,
        correlation_id,
        client_software_name="tests",
        client_software_version="1.0",
    )


def metadata(correlation_id: int = 7) -> bytes:
    return request(
        ApiKey.METADATA,
        12,
        correlation_id,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def produce(correlation_id: int = 8) -> bytes:
    batches = [PartitionBatch("t", 0, memoryview(b""))]
    body = encode_produce_request(9, acks=1, timeout_ms=1000, partitions=batches)
    header = encode_request_header(ApiKey.PRODUCE, 9, correlation_id, "tests")
    return build_frame(header, b"".join(bytes(chunk) for chunk in body))


def raw(token: bytes) -> bytes:
    """A legacy token frame (after SaslHandshake v0): its size, then the token, no header."""
    return INT32.pack(len(token)) + token


# Reading what kipside answers -----------------------------------------------------------------


@dataclass(frozen=True)
class HandshakeReply:
    correlation_id: int
    error_code: int
    mechanisms: tuple[str, ...]


@dataclass(frozen=True)
class AuthenticateReply:
    correlation_id: int
    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int | None
    """None in v0, which has no such field."""


def handshake_reply(answer: bytes | None, version: int) -> HandshakeReply:
    assert answer is not None
    head = parse_response_header(answer, ApiKey.SASL_HANDSHAKE, version)
    message = decode_response(ApiKey.SASL_HANDSHAKE, version, answer, head.body_offset)
    return HandshakeReply(head.correlation_id, int(message.error_code), tuple(message.mechanisms))


def authenticate_reply(answer: bytes | None, version: int) -> AuthenticateReply:
    assert answer is not None
    head = parse_response_header(answer, ApiKey.SASL_AUTHENTICATE, version)
    message = decode_response(ApiKey.SASL_AUTHENTICATE, version, answer, head.body_offset)
    lifetime: datetime.timedelta | None = getattr(message, "session_lifetime", None)
    return AuthenticateReply(
        head.correlation_id,
        int(message.error_code),
        message.error_message,
        bytes(message.auth_bytes),
        None if lifetime is None else int(lifetime.total_seconds() * 1000),
    )


def raw_reply(answer: bytes | None) -> bytes:
    """The token of a legacy answer frame, checked to be a size and exactly that many bytes."""
    assert answer is not None
    assert INT32.unpack_from(answer, 0)[0] == len(answer) - 4
    return answer[4:]


def send(sasl: ClientSasl, frame: bytes) -> SaslStep | None:
    """A frame from the client, fed as the session and the SASL stage feed it when kipside
    terminates SASL: a raw token while one is due, else the request's header is checked first
    and SaslHandshake/SaslAuthenticate are answered. None: the request goes on."""
    assert sasl.terminates
    if sasl.raw_token_due:
        return sasl.raw_token(frame)
    header = parse_request_header(frame)
    step = sasl.before_authentication(header)
    if step is None and header.api_key in SASL_APIS:
        step = sasl.answer(frame, header)
    return step


def login(
    sasl: ClientSasl,
    mechanism: str,
    user: str,
    password: str,
    *,
    authenticate_version: int = 1,
) -> list[SaslStep]:
    """SaslHandshake v1, then SaslAuthenticate with kipside.protocol's client until the exchange
    ends or kipside closes: kipside's step for each SaslAuthenticate."""
    step = send(sasl, handshake(mechanism))
    assert step is not None and step.close is None
    assert handshake_reply(step.answer, 1).error_code == ErrorCode.none
    client = new_client(mechanism, user, password)
    token: bytes | None = client.first()
    steps: list[SaslStep] = []
    while token is not None:
        step = send(sasl, authenticate(token, authenticate_version, 2 + len(steps)))
        assert step is not None
        steps.append(step)
        if step.close is not None:
            break
        token = client.step(authenticate_reply(step.answer, authenticate_version).auth_bytes)
    return steps


# Termination: successful logins ---------------------------------------------------------------


@pytest.mark.parametrize("authenticate_version", [0, 1, 2])
def test_plain_login_proves_the_principal_and_lets_requests_through(
    authenticate_version: int,
) -> None:
    sasl = ClientSasl(termination())
    assert sasl.terminates and sasl.principal is None
    assert send(sasl, api_versions()) is None  # Kafka answers ApiVersions before authentication

    step = send(sasl, handshake(PLAIN, 1, correlation_id=11))
    assert step is not None and step.close is None and step.principal is None
    assert handshake_reply(step.answer, 1) == HandshakeReply(11, ErrorCode.none, SASL_MECHANISMS)
    assert not sasl.raw_token_due  # v1: the tokens come in SaslAuthenticate

    token = b"\0alice\0" + PASSWORDS["alice"].encode()
    step = send(sasl, authenticate(token, authenticate_version, correlation_id=12))
    assert step is not None and step.close is None
    alice = Principal("User:alice", "sasl")
    assert step.principal == alice and sasl.principal == alice
    assert authenticate_reply(step.answer, authenticate_version) == AuthenticateReply(
        12,
        ErrorCode.none,
        None,
        b"",
        # 0: no re-authentication is asked of the client (KIP-368); v0 has no such field.
        None if authenticate_version == 0 else 0,
    )

    # Authenticated: every request goes on to the rest of the pipeline.
    assert send(sasl, metadata()) is None
    assert send(sasl, produce()) is None


class ScrampClient:
    """scramp's SCRAM client behind the first()/step() shape of kipside.protocol's."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._client = scramp.ScramClient([mechanism], user, password)
        self._final_sent = False

    def first(self) -> bytes:
        first: str = self._client.get_client_first()
        return first.encode()

    def step(self, token: bytes) -> bytes | None:
        if not self._final_sent:
            self._client.set_server_first(token.decode())
            self._final_sent = True
            final: str = self._client.get_client_final()
            return final.encode()
        self._client.set_server_final(token.decode())  # raises if the server's proof is wrong
        return None


@pytest.mark.parametrize("authenticate_version", [1, 2])
@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_scram_full_exchange_with_scramp_as_the_client(
    mechanism: str, authenticate_version: int
) -> None:
    sasl = ClientSasl(termination())
    step = send(sasl, handshake(mechanism, 1, correlation_id=1))
    assert step is not None
    assert handshake_reply(step.answer, 1).error_code == ErrorCode.none

    client = ScrampClient(mechanism, "bob", PASSWORDS["bob"])
    first = send(sasl, authenticate(client.first(), authenticate_version, correlation_id=2))
    assert first is not None and first.close is None
    assert first.principal is None and sasl.principal is None  # one round trip to go
    server_first = authenticate_reply(first.answer, authenticate_version)
    assert (server_first.correlation_id, server_first.error_code) == (2, ErrorCode.none)
    assert server_first.auth_bytes.startswith(b"r=")
    stored = CREDENTIALS[("bob", mechanism)]
    assert f"i={stored.iterations}".encode() in server_first.auth_bytes.split(b",")

    client_final = client.step(server_first.auth_bytes)
    assert client_final is not None
    final = send(sasl, authenticate(client_final, authenticate_version, correlation_id=3))
    assert final is not None and final.close is None
    server_final = authenticate_reply(final.answer, authenticate_version)
    assert (server_final.correlation_id, server_final.error_code) == (3, ErrorCode.none)
    assert server_final.session_lifetime_ms == 0
    assert client.step(server_final.auth_bytes) is None  # scramp checked the server signature
    assert final.principal == Principal("User:bob", "sasl") == sasl.principal
    assert send(sasl, metadata()) is None


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_login_with_kipsides_own_client(mechanism: str) -> None:
    sasl = ClientSasl(termination())
    steps = login(sasl, mechanism, "alice", PASSWORDS["alice"], authenticate_version=2)
    assert len(steps) == SASL_ROUND_TRIPS[mechanism]
    assert steps[-1].principal == Principal("User:alice", "sasl") == sasl.principal
    assert all(step.principal is None for step in steps[:-1])
    assert all(step.close is None for step in steps)


# Termination: refusals ------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [
        ("alice", "guessed-pw", "wrong password for user 'alice'"),
        ("mallory", "mallory-pw", "unknown user 'mallory'"),
    ],
    ids=["wrong-password", "unknown-user"],
)
def test_wrong_credentials_get_kafkas_failure_answer_then_a_close(
    mechanism: str, user: str, password: str, reason: str
) -> None:
    sasl = ClientSasl(termination())
    steps = login(sasl, mechanism, user, password, authenticate_version=1)
    # PLAIN fails on its one token; SCRAM on its final message for a wrong password, and on the
    # first for an unknown user.
    expected_round_trips = 2 if mechanism in SCRAM_MECHANISMS and "wrong" in reason else 1
    assert len(steps) == expected_round_trips
    failed = steps[-1]
    reply = authenticate_reply(failed.answer, 1)
    assert reply == AuthenticateReply(
        2 + len(steps) - 1,
        ErrorCode.sasl_authentication_failed,
        failed_message(mechanism),
        b"",
        0,
    )
    assert reply.error_message == (
        "Authentication failed: Invalid username or password"
        if mechanism == "PLAIN"
        else "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )
    assert failed.close is not None
    assert failed.close.startswith(f"SASL {mechanism} authentication failed: ")
    assert reason in failed.close
    assert password not in failed.close and password.encode() not in (failed.answer or b"")
    assert failed.principal is None and sasl.principal is None


@pytest.mark.parametrize("version", [0, 1])
def test_an_unsupported_mechanism_is_refused_at_the_handshake(version: int) -> None:
    sasl = ClientSasl(termination())
    step = send(sasl, handshake("GSSAPI", version, correlation_id=5))
    assert step is not None
    assert handshake_reply(step.answer, version) == HandshakeReply(
        5, ErrorCode.unsupported_sasl_mechanism, SASL_MECHANISMS
    )
    assert step.close is not None and "'GSSAPI'" in step.close
    assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" in step.close
    assert not sasl.raw_token_due  # no legacy token follows a refused v0 handshake
    assert step.principal is None and sasl.principal is None


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_before_a_handshake_is_an_illegal_state(version: int) -> None:
    sasl = ClientSasl(termination())
    token = b"\0alice\0" + PASSWORDS["alice"].encode()
    step = send(sasl, authenticate(token, version, correlation_id=4))
    assert step is not None
    reply = authenticate_reply(step.answer, version)
    assert (reply.correlation_id, reply.error_code, reply.error_message) == (
        4,
        ErrorCode.illegal_sasl_state,
        "SaslAuthenticate out of order",
    )
    assert step.close == "sent SaslAuthenticate without a SaslHandshake v1 before it"
    assert step.principal is None and sasl.principal is None  # the right password changed nothing


@pytest.mark.parametrize(
    ("frame", "name"),
    [(metadata(), "Metadata"), (produce(), "Produce")],
    ids=["metadata", "produce"],
)
@pytest.mark.parametrize("after_handshake", [False, True])
def test_a_request_before_authentication_closes_without_an_answer(
    frame: bytes, name: str, after_handshake: bool
) -> None:
    sasl = ClientSasl(termination())
    if after_handshake:  # the handshake alone proves nothing
        assert send(sasl, handshake(SCRAM_SHA_256)) is not None
    step = send(sasl, frame)
    assert step is not None
    assert step.answer is None and step.principal is None
    assert step.close is not None
    assert step.close.startswith(f"sent {name} before authenticating; kipside requires SASL")
    assert "SASL_PLAINTEXT or SASL_SSL" in step.close
    assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" in step.close


def test_passthrough_never_holds_a_request_back_for_authentication() -> None:
    sasl = ClientSasl()
    for frame in (metadata(), produce(), api_versions()):
        assert sasl.before_authentication(parse_request_header(frame)) is None


@pytest.mark.parametrize(
    ("upstream_source", "where"),
    [("upstream.yaml", "upstream.yaml"), (None, "(no --sasl-upstream file)")],
)
@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_a_principal_without_an_upstream_login_is_refused(
    mechanism: str, upstream_source: str | None, where: str
) -> None:
    sasl = ClientSasl(termination(upstream_source))
    steps = login(sasl, mechanism, "carol", PASSWORDS["carol"])  # the right password
    assert len(steps) == SASL_ROUND_TRIPS[mechanism]
    refused = steps[-1]
    reply = authenticate_reply(refused.answer, 1)
    assert (reply.error_code, reply.error_message, reply.auth_bytes) == (
        ErrorCode.sasl_authentication_failed,
        "kipside has no login to the brokers for User:carol",
        b"",
    )
    assert refused.close == (
        f"SASL {mechanism} authentication failed: User:carol has no upstream login in {where}; "
        "add one under principals there, so kipside can log in to the brokers for it"
    )
    assert refused.principal is None and sasl.principal is None
    assert not sasl.raw_token_due


def test_a_malformed_sasl_request_closes_without_an_answer() -> None:
    sasl = ClientSasl(termination())
    cut = handshake(PLAIN)[:-2]
    step = send(sasl, INT32.pack(len(cut) - 4) + cut[4:])
    assert step is not None and step.answer is None
    assert step.close is not None and step.close.startswith("sent a malformed SaslHandshake (")

    sasl = ClientSasl(termination())
    send(sasl, handshake(PLAIN))
    frame = authenticate(b"token")[:-3]
    step = send(sasl, INT32.pack(len(frame) - 4) + frame[4:])
    assert step is not None and step.answer is None
    assert step.close is not None and step.close.startswith("sent a malformed SaslAuthenticate (")
    assert sasl.principal is None


# Termination: re-authentication (KIP-368) -------------------------------------------------------


def test_no_re_authentication_a_second_handshake_is_an_illegal_state() -> None:
    """kipside tells every client its session never expires (session lifetime 0), so a client
    never re-authenticates; a SaslHandshake on an authenticated connection is refused with
    ILLEGAL_SASL_STATE and the connection closed, the principal unchanged."""
    sasl = ClientSasl(termination())
    steps = login(sasl, PLAIN, "alice", PASSWORDS["alice"], authenticate_version=2)
    assert authenticate_reply(steps[-1].answer, 2).session_lifetime_ms == 0
    alice = Principal("User:alice", "sasl")
    assert sasl.principal == alice

    again = send(sasl, handshake(SCRAM_SHA_512, 1, correlation_id=20))
    assert again is not None
    assert handshake_reply(again.answer, 1) == HandshakeReply(
        20, ErrorCode.illegal_sasl_state, SASL_MECHANISMS
    )
    assert again.close == "sent a second SaslHandshake"
    assert again.principal is None and sasl.principal == alice


def test_no_re_authentication_authenticate_after_login_is_an_illegal_state() -> None:
    sasl = ClientSasl(termination())
    login(sasl, PLAIN, "alice", PASSWORDS["alice"])
    token = b"\0bob\0" + PASSWORDS["bob"].encode()
    step = send(sasl, authenticate(token, 1, correlation_id=21))
    assert step is not None
    reply = authenticate_reply(step.answer, 1)
    assert (reply.correlation_id, reply.error_code) == (21, ErrorCode.illegal_sasl_state)
    assert step.close is not None and step.principal is None
    assert sasl.principal == Principal("User:alice", "sasl")  # bob's password changed nothing


def test_a_second_handshake_before_authenticating_is_an_illegal_state() -> None:
    sasl = ClientSasl(termination())
    send(sasl, handshake(PLAIN))
    step = send(sasl, handshake(SCRAM_SHA_256, 1, correlation_id=3))
    assert step is not None
    assert handshake_reply(step.answer, 1).error_code == ErrorCode.illegal_sasl_state
    assert step.close == "sent a second SaslHandshake"


# Termination: the legacy flow (SaslHandshake v0, then raw tokens) -----------------------------


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_legacy_login_answers_raw_tokens_then_kafka_framing_resumes(mechanism: str) -> None:
    sasl = ClientSasl(termination())
    step = send(sasl, handshake(mechanism, 0, correlation_id=1))
    assert step is not None and step.close is None
    assert handshake_reply(step.answer, 0) == HandshakeReply(1, ErrorCode.none, SASL_MECHANISMS)
    assert sasl.raw_token_due

    client = new_client(mechanism, "alice", PASSWORDS["alice"])
    token: bytes | None = client.first()
    steps: list[SaslStep] = []
    while token is not None:
        assert sasl.raw_token_due
        step = send(sasl, raw(token))
        assert step is not None and step.close is None
        steps.append(step)
        token = client.step(raw_reply(step.answer))
    assert len(steps) == SASL_ROUND_TRIPS[mechanism]
    assert client.complete  # for SCRAM: the server's signature was right
    assert steps[-1].principal == Principal("User:alice", "sasl") == sasl.principal
    assert all(step.principal is None for step in steps[:-1])
    assert not sasl.raw_token_due
    assert send(sasl, metadata()) is None  # a Kafka request again, and it goes on


def test_legacy_plain_answer_is_an_empty_token_frame() -> None:
    sasl = ClientSasl(termination())
    send(sasl, handshake(PLAIN, 0))
    step = send(sasl, raw(b"\0alice\0" + PASSWORDS["alice"].encode()))
    assert step is not None and step.answer == b"\x00\x00\x00\x00"


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [
        ("alice", "guessed-pw", "wrong password for user 'alice'"),
        ("mallory", "mallory-pw", "unknown user 'mallory'"),
        ("carol", PASSWORDS["carol"], "User:carol has no upstream login in upstream.yaml"),
    ],
    ids=["wrong-password", "unknown-user", "no-upstream-login"],
)
def test_a_failed_legacy_login_closes_without_an_error_frame(
    mechanism: str, user: str, password: str, reason: str
) -> None:
    sasl = ClientSasl(termination())
    send(sasl, handshake(mechanism, 0))
    client = new_client(mechanism, user, password)
    token: bytes | None = client.first()
    while True:
        assert token is not None and sasl.raw_token_due
        step = send(sasl, raw(token))
        assert step is not None
        if step.close is not None:
            break
        token = client.step(raw_reply(step.answer))
    assert step.answer is None  # the legacy flow has no error frame
    assert step.close.startswith(f"SASL {mechanism} authentication failed: ")
    assert reason in step.close
    assert step.principal is None and sasl.principal is None
    assert not sasl.raw_token_due


# Passthrough ----------------------------------------------------------------------------------


def broker_handshake_answer(frame: bytes, error: ErrorCode) -> bytes:
    """The broker's answer to the client's SaslHandshake `frame`."""
    header = parse_request_header(frame)
    cls = response_class(ApiKey.SASL_HANDSHAKE, header.api_version)
    body = encode_message(cls(error_code=error, mechanisms=(PLAIN, SCRAM_SHA_256)))
    return response_frame(header, body)


@pytest.mark.parametrize(
    "frame",
    [
        handshake(PLAIN, 1),
        handshake("GSSAPI", 1),  # v1: any mechanism, its tokens framed by SaslAuthenticate
        handshake("OAUTHBEARER", 1),
        authenticate(b"token", 0),
        authenticate(b"token", 1),
        authenticate(b"token", 2),
    ],
    ids=["v1-plain", "v1-gssapi", "v1-oauthbearer", "auth-v0", "auth-v1", "auth-v2"],
)
def test_passthrough_forwards_sasl_requests(frame: bytes) -> None:
    sasl = ClientSasl()
    assert not sasl.terminates
    header = parse_request_header(frame)
    assert sasl.forwarding(frame, header) is FORWARD
    assert SaslStep() == FORWARD  # nothing owed, nothing closed, nobody proved
    if header.api_key == ApiKey.SASL_HANDSHAKE:
        sasl.broker_answered(
            header.api_key, header.api_version, broker_handshake_answer(frame, ErrorCode.none)
        )
    assert not sasl.raw_token_due and sasl.principal is None


@pytest.mark.parametrize("mechanism", [PLAIN, SCRAM_SHA_256, SCRAM_SHA_512])
def test_passthrough_counts_the_raw_tokens_after_an_accepted_legacy_handshake(
    mechanism: str,
) -> None:
    sasl = ClientSasl()
    frame = handshake(mechanism, 0)
    assert sasl.forwarding(frame, parse_request_header(frame)) is FORWARD
    assert not sasl.raw_token_due  # not before the broker says yes

    sasl.broker_answered(ApiKey.SASL_HANDSHAKE, 0, broker_handshake_answer(frame, ErrorCode.none))
    due: list[bool] = []
    for _ in range(3):  # more tokens than any mechanism's round trips
        if not sasl.raw_token_due:
            break
        sasl.raw_token_forwarded()
        due.append(sasl.raw_token_due)
    # One token each way per round trip; then Kafka framing again.
    assert len(due) == SASL_ROUND_TRIPS[mechanism] == {PLAIN: 1}.get(mechanism, 2)
    assert due == [True] * (len(due) - 1) + [False]
    assert sasl.principal is None  # the broker authenticated the client, not kipside


def test_passthrough_a_refused_legacy_handshake_is_followed_by_no_raw_token() -> None:
    sasl = ClientSasl()
    frame = handshake(SCRAM_SHA_512, 0)
    sasl.forwarding(frame, parse_request_header(frame))
    refused = broker_handshake_answer(frame, ErrorCode.unsupported_sasl_mechanism)
    sasl.broker_answered(ApiKey.SASL_HANDSHAKE, 0, refused)
    assert not sasl.raw_token_due

    # An answer with no v0 handshake forwarded before it switches nothing.
    sasl.broker_answered(ApiKey.SASL_HANDSHAKE, 0, broker_handshake_answer(frame, ErrorCode.none))
    assert not sasl.raw_token_due


def test_passthrough_only_a_v0_handshake_answer_switches_to_raw_tokens() -> None:
    sasl = ClientSasl()
    v0 = handshake(PLAIN, 0)
    sasl.forwarding(v0, parse_request_header(v0))
    # Answers to other APIs, or to a v1 handshake, leave the v0 exchange waiting.
    sasl.broker_answered(ApiKey.API_VERSIONS, 0, b"\x00\x00\x00\x06\x00\x00\x00\x01\x00\x00")
    sasl.broker_answered(ApiKey.SASL_HANDSHAKE, 1, broker_handshake_answer(v0, ErrorCode.none))
    assert not sasl.raw_token_due
    sasl.broker_answered(ApiKey.SASL_HANDSHAKE, 0, broker_handshake_answer(v0, ErrorCode.none))
    assert sasl.raw_token_due


@pytest.mark.parametrize("mechanism", ["GSSAPI", "OAUTHBEARER", "SCRAM-SHA-1"])
def test_passthrough_refuses_a_legacy_handshake_it_could_not_count(mechanism: str) -> None:
    sasl = ClientSasl()
    frame = handshake(mechanism, 0, correlation_id=9)
    step = sasl.forwarding(frame, parse_request_header(frame))
    assert handshake_reply(step.answer, 0) == HandshakeReply(
        9, ErrorCode.unsupported_sasl_mechanism, (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
    )
    assert step.close is not None
    assert step.close.startswith(f"asked for SASL {mechanism} with SaslHandshake v0")
    assert "SaslAuthenticate" in step.close
    assert not sasl.raw_token_due and step.principal is None


def test_passthrough_a_malformed_legacy_handshake_closes_without_an_answer() -> None:
    sasl = ClientSasl()
    cut = handshake(PLAIN, 0)[:-2]
    frame = INT32.pack(len(cut) - 4) + cut[4:]
    step = sasl.forwarding(frame, parse_request_header(frame))
    assert step.answer is None
    assert step.close is not None
    assert step.close.startswith("sent a malformed SaslHandshake v0 (")
    assert not sasl.raw_token_due
