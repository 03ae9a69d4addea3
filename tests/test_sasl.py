"""kipside.protocol's SASL state machines, wired to each other and to scramp (an independent
SCRAM implementation), with RFC 7677's example exchange. No sockets."""

from __future__ import annotations

import base64

import pytest
import scramp

from kipside.protocol import (
    PLAIN,
    SCRAM_MECHANISMS,
    AuthenticationFailed,
    SaslProtocolError,
    ScramCredential,
    new_client,
    new_server,
    scram_credential,
)
from kipside.protocol.sasl import ScramClient, ScramServer

PASSWORD = "s3cret-pa55"


def store(**users: str) -> dict[tuple[str, str], ScramCredential]:
    return {
        (user, mechanism): scram_credential(mechanism, password)
        for user, password in users.items()
        for mechanism in SCRAM_MECHANISMS
    }


def exchange(mechanism: str, user: str, password: str, users: dict[str, str]) -> str | None:
    credentials = store(**users)
    server = new_server(mechanism, lambda name, mech: credentials.get((name, mech)))
    client = new_client(mechanism, user, password)
    token: bytes | None = client.first()
    while token is not None:
        token = client.step(server.step(token))
    assert server.complete and client.complete
    return server.username


@pytest.mark.parametrize("mechanism", [PLAIN, *SCRAM_MECHANISMS])
def test_client_and_server_agree(mechanism: str) -> None:
    assert exchange(mechanism, "alice", PASSWORD, {"alice": PASSWORD, "bob": "x"}) == "alice"


@pytest.mark.parametrize("mechanism", [PLAIN, *SCRAM_MECHANISMS])
def test_wrong_password_and_unknown_user_fail_without_the_secret(mechanism: str) -> None:
    with pytest.raises(AuthenticationFailed) as wrong:
        exchange(mechanism, "alice", "guessed-pw", {"alice": PASSWORD})
    assert "wrong password for user 'alice'" in str(wrong.value)
    with pytest.raises(AuthenticationFailed, match="unknown user 'mallory'"):
        exchange(mechanism, "mallory", PASSWORD, {"alice": PASSWORD})
    assert "guessed-pw" not in str(wrong.value) and PASSWORD not in str(wrong.value)


def test_rfc7677_example() -> None:
    # RFC 7677 section 3: user "user", password "pencil", the nonces below.
    mechanism = "SCRAM-SHA-256"
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    stored = scram_credential(mechanism, "pencil", salt=salt, iterations=4096)
    server = ScramServer(mechanism, lambda *_: stored, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    client = ScramClient(mechanism, "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = server.step(client.first())
    assert server_first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    client_final = client.step(server_first)
    assert client_final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    server_final = server.step(client_final)
    assert server_final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert client.step(server_final) is None and client.complete


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_kipside_client_against_scramp_server(mechanism: str) -> None:
    scram = scramp.ScramMechanism(mechanism)
    salt, stored_key, server_key, iterations = scram.make_auth_info(PASSWORD)
    server = scram.make_server(lambda _user: (salt, stored_key, server_key, iterations))
    client = new_client(mechanism, "alice", PASSWORD)
    server.set_client_first(client.first().decode())
    final = client.step(server.get_server_first().encode())
    assert final is not None
    server.set_client_final(final.decode())
    assert client.step(server.get_server_final().encode()) is None


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_scramp_client_against_kipside_server(mechanism: str) -> None:
    credentials = store(alice=PASSWORD)
    server = new_server(mechanism, lambda name, mech: credentials.get((name, mech)))
    client = scramp.ScramClient([mechanism], "alice", PASSWORD)
    first = server.step(client.get_client_first().encode())
    client.set_server_first(first.decode())
    final = server.step(client.get_client_final().encode())
    client.set_server_final(final.decode())
    assert server.complete and server.username == "alice"


def test_malformed_tokens_are_protocol_errors() -> None:
    credentials = store(alice=PASSWORD)
    lookup = lambda name, mech: credentials.get((name, mech))  # noqa: E731
    for token in (b"alice", b"\xff\xfe", b"a\0b"):
        with pytest.raises(SaslProtocolError):
            new_server(PLAIN, lookup).step(token)
    with pytest.raises(SaslProtocolError, match="channel binding"):
        new_server("SCRAM-SHA-256", lookup).step(b"p=tls-unique,,n=alice,r=abc")
    with pytest.raises(SaslProtocolError, match="not supported; use one of PLAIN"):
        new_server("GSSAPI", lookup)
    with pytest.raises(AuthenticationFailed, match="authorization id"):
        new_server(PLAIN, lookup).step(f"bob\0alice\0{PASSWORD}".encode())


def test_repr_holds_no_secret() -> None:
    credential = scram_credential("SCRAM-SHA-512", PASSWORD)
    for thing in (credential, new_client(PLAIN, "alice", PASSWORD)):
        assert PASSWORD not in repr(thing)
    assert credential.stored_key.hex() not in repr(credential)
