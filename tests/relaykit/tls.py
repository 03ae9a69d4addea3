"""The TLS broker of the tests: a TLS-terminating relay in front of Tansu, and test certificates.

Tansu 0.6.0 has no TLS listener. `TlsTerminatingRelay` stands where an Apache Kafka broker's SSL
listener would: it completes a TLS handshake with whoever connects (its certificate signed by a
CA made at test time; optionally requiring a client certificate, as `ssl.client.auth=required`
does), then carries plaintext Kafka to Tansu, which advertises the relay's address
(relaykit.tansu.tansu_behind). It is a simulation of a TLS broker, not a broker: everything
after the handshake is relaykit.base.Relay's, byte for byte. It records, for the tests to
assert on, each handshake (the SNI name sent, the client certificate's subject, or why it
failed) and the client ids of the requests each connection carried.

`TestCA` makes a CA and certificates with trustme and writes them as PEM files.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import trio
import trustme

from .base import CONNECT_TIMEOUT, Relay
from .decisions import FORWARD, Conn, Decision, Request


@dataclass(frozen=True)
class CertFiles:
    """A certificate (chain, PEM) and its private key (PEM), as files."""

    cert: Path
    key: Path


class TestCA:
    """A certificate authority made at test time, writing PEM files into `directory`."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._ca = trustme.CA(organization_name=f"kipside tests {name}")
        self.pem = directory / f"{name}-ca.pem"
        self._ca.cert_pem.write_to_path(str(self.pem))

    def issue(
        self, stem: str, *hosts: str, common_name: str | None = None, unit: str | None = None
    ) -> CertFiles:
        """A certificate for `hosts` (DNS names or IP addresses) written to STEM.pem and
        STEM.key, each replaced atomically (a reader never sees half a file)."""
        leaf = self._ca.issue_cert(
            *hosts,
            common_name=common_name,
            organization_name=f"kipside tests {self.name}",
            organization_unit_name=unit or "test",
        )
        files = CertFiles(self.directory / f"{stem}.pem", self.directory / f"{stem}.key")
        chain = b"".join(pem.bytes() for pem in leaf.cert_chain_pems)
        _replace(files.cert, chain)
        _replace(files.key, leaf.private_key_pem.bytes())
        return files


def _replace(path: Path, data: bytes) -> None:
    temporary = path.with_suffix(path.suffix + ".new")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def server_context(files: CertFiles, client_ca: Path | None = None) -> ssl.SSLContext:
    """A TLS server context serving `files`; with `client_ca`, clients must present a
    certificate signed by it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass(frozen=True)
class Handshake:
    """One TLS handshake the relay saw: the SNI name sent, the client certificate's subject
    (as ssl.getpeercert() gives it), or why it failed."""

    server_name: str | None
    client_subject: tuple[tuple[tuple[str, str], ...], ...] | None
    error: str | None = None


class TlsTerminatingRelay(Relay):
    """A TLS listener in front of Tansu (see the module doc), serving `files`; with
    `client_ca`, it requires a client certificate signed by that CA."""

    def __init__(
        self,
        files: CertFiles,
        client_ca: Path | None = None,
        upstream: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(upstream)
        self.files = files
        self.client_ca = client_ca
        self._handshakes: list[Handshake] = []
        self._client_ids: dict[int, set[str]] = {}

    def handshakes(self) -> list[Handshake]:
        with self._lock:
            return list(self._handshakes)

    def client_ids(self) -> dict[int, set[str]]:
        """The client ids of the requests each connection carried, by connection number."""
        with self._lock:
            return {number: set(ids) for number, ids in self._client_ids.items()}

    async def carry(self, client: trio.abc.Stream, broker: trio.abc.Stream | None = None) -> None:
        if broker is not None:  # memory streams from a test: no TLS to terminate
            await super().carry(client, broker)
            return
        # A context per connection, so its SNI callback knows which handshake it serves.
        sni: list[str | None] = [None]
        context = server_context(self.files, self.client_ca)
        context.sni_callback = lambda _ssl, name, _ctx: sni.__setitem__(0, name)
        tls = trio.SSLStream(client, context, server_side=True)
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            why = repr(exc.__cause__ or exc)
            with self._lock:
                self._handshakes.append(Handshake(sni[0], None, why))
            await trio.aclose_forcefully(tls)
            return
        peer = tls.getpeercert()
        subject = peer.get("subject") if peer else None
        with self._lock:
            self._handshakes.append(Handshake(sni[0], subject))
        await super().carry(tls)

    def on_request(self, conn: Conn, request: Request) -> Decision:
        with self._lock:
            ids = self._client_ids.setdefault(conn.number, set())
            ids.add(request.header.client_id or "")
        return FORWARD
