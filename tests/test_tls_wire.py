"""proxy.transport.tls and security.certificates without a broker: TlsWire's ordered writes and
reads on real loopback sockets, a client certificate's principal as Kafka writes it (RFC 2253),
and the TLS options' usage errors."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.x509.oid import NameOID
from testkit.ports import loopback_pair

from kipside.proxy.cli import main
from kipside.proxy.core.identity import Principal
from kipside.proxy.security.certificates import certificate_principal, rfc2253
from kipside.proxy.transport.tls import TlsWire

TIMEOUT = 10


@asynccontextmanager
async def tls_pair() -> AsyncIterator[tuple[TlsWire, TlsWire]]:
    """(server, client) TlsWires on a loopback TCP pair with small kernel buffers, the client
    trusting the server's certificate for 127.0.0.1; handshakes not yet done."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    near, far = loopback_pair(64 * 1024)
    server = TlsWire(far, server_context, server_side=True)
    client = TlsWire(near, client_context, server_side=False, server_hostname="127.0.0.1")
    try:
        yield server, client
    finally:
        server.close()
        client.close()


async def handshakes(server: TlsWire, client: TlsWire) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handshake)
        nursery.start_soon(client.handshake)


async def read_exactly(wire: TlsWire, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        data = await wire.receive()
        assert data, f"closed after {len(out)} of {size} bytes"
        out += data
    return bytes(out)


async def test_writes_made_with_the_handshake_are_read() -> None:
    """The client's first write leaves with its last handshake record (TLS 1.3: Finished, then
    at once a request): the server reads it without waiting for more bytes."""
    with trio.fail_after(TIMEOUT):
        async with tls_pair() as (server, client), trio.open_nursery() as nursery:

            async def client_side() -> None:
                await client.handshake()
                client.write([b"first request"])  # before the server runs again

            nursery.start_soon(client_side)
            await server.handshake()
            assert await server.receive() == b"first request"


async def test_ordered_writes_through_a_backlog_both_ways() -> None:
    """Megabytes written in many synchronous calls (several buffers each) before the peer
    reads: the ciphertext the kernel refuses waits in the backlog, later writes queue behind
    it, and the peer decrypts every byte in write order."""
    with trio.fail_after(TIMEOUT):
        async with tls_pair() as (server, client), trio.open_nursery() as nursery:
            await handshakes(server, client)
            nursery.start_soon(server.run_flusher)
            nursery.start_soon(client.run_flusher)
            chunks = [bytes([i % 251]) * (150_000 + i) for i in range(12)]
            for i, chunk in enumerate(chunks):
                client.write([chunk[:7], memoryview(chunk)[7:]] if i % 3 else [chunk])
                server.write([chunk[:5]])
            assert client.backlog_bytes > 0  # the kernel could not take it all at once
            expected = b"".join(chunks)
            assert await read_exactly(server, len(expected)) == expected
            answers = b"".join(chunk[:5] for chunk in chunks)
            assert await read_exactly(client, len(answers)) == answers
            await client.drained()
            nursery.cancel_scope.cancel()


async def test_close_notify_reads_as_the_end_and_is_answered() -> None:
    with trio.fail_after(TIMEOUT):
        async with tls_pair() as (server, client):
            await handshakes(server, client)
            client.write([b"last"])
            await client.send_eof()  # close_notify, then FIN
            assert await server.receive() == b"last"
            assert await server.receive() == b""
            server.close()  # answers with its own close_notify before closing
            assert await client.receive() == b""
            assert client.broken_reason is None


# --------------------------------------------------------------------------- principals


def name(*rdns: list[tuple[x509.ObjectIdentifier, str]]) -> x509.Name:
    """A Name from RDNs in certificate order (the most significant first)."""
    return x509.Name(
        [x509.RelativeDistinguishedName([x509.NameAttribute(o, v) for o, v in rdn]) for rdn in rdns]
    )


def test_rfc2253_as_java_writes_it() -> None:
    """The last RDN first; Java's escaping (the special characters anywhere, spaces at the
    ends); attributes without an RFC 2253 keyword (emailAddress) as OID=#DER-hex; a
    multi-valued RDN joined with '+'."""
    subject = name(
        [(NameOID.COUNTRY_NAME, "US")],
        [(NameOID.ORGANIZATION_NAME, "Acme, Inc.")],
        [(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops #1"), (NameOID.USER_ID, "u1")],
        [(NameOID.EMAIL_ADDRESS, "a@b.c")],
        [(NameOID.COMMON_NAME, " app=1 ")],
    )
    assert rfc2253(subject) == (
        r"CN=\ app\=1\ ,1.2.840.113549.1.9.1=#16056140622e63,OU=ops \#1+UID=u1,"
        r"O=Acme\, Inc.,C=US"
    )


def test_a_client_certificate_names_its_principal() -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert(
        "app.test", common_name="app", organization_name="acme", organization_unit_name="pay"
    )
    der = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
    assert certificate_principal(der) == Principal("User:CN=app,OU=pay,O=acme", "tls")


# --------------------------------------------------------------------------- options

SERVE = ["serve", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "k.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca (mutual TLS) needs --tls-cert and"),
        (
            ["--upstream-cert", "c.pem"],
            "--upstream-key and --upstream-server-name need --upstream-ca",
        ),
        (["--upstream-server-name", "b"], "need --upstream-ca FILE"),
        (
            ["--upstream-ca", "ca.pem", "--upstream-key", "k"],
            "--upstream-cert and --upstream-key go",
        ),
    ],
)
def test_tls_options_that_need_each_other(
    options: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything starts (exit status 2), with the option that is missing."""
    assert main([*SERVE, *options]) == 2
    assert says in capsys.readouterr().err
