"""Who kipside talks to, and as whom: TLS toward clients and brokers, SASL toward both.

`Security` is built once from the server's settings. It accepts a client's connection (a TLS
handshake on a TLS listener, and the certificate's principal with mTLS), dials brokers for a
principal (TLS, then that principal's SASL login) and says whether kipside terminates the
clients' SASL itself. Loading fails with SecurityError, whose message names the file and what
to change.
"""

from __future__ import annotations

import logging

import trio

from kipside.protocol import Address
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.security import (
    CredentialsError,
    CredentialStore,
    Termination,
    UpstreamLogins,
    load_credentials,
    load_upstream_logins,
    log_in,
)
from kipside.proxy.security.certificates import (
    CertificateError,
    ListenerTls,
    ListenerTlsFiles,
    UpstreamTls,
    UpstreamTlsFiles,
)
from kipside.proxy.transport.dial import plain_dial
from kipside.proxy.transport.tls import TlsError
from kipside.proxy.transport.wire import Wire

__all__ = ["Security", "SecurityError"]

log = logging.getLogger("kipside.server")


class SecurityError(ValueError):
    """A TLS or SASL file can't be used, or the options don't fit together."""


class Security:
    def __init__(
        self,
        *,
        tls: ListenerTlsFiles | None = None,
        upstream_tls: UpstreamTlsFiles | None = None,
        sasl_credentials: str | None = None,
        sasl_upstream: str | None = None,
    ) -> None:
        """The server's settings of the same names (ServerConfig); None: that part is off."""
        self.listener_tls: ListenerTls | None = None
        self.upstream_tls: UpstreamTls | None = None
        self.sasl_credentials: CredentialStore | None = None
        self.upstream_logins: UpstreamLogins | None = None
        try:
            self._load_tls(tls, upstream_tls)
            self._load_sasl(sasl_credentials, sasl_upstream)
        except (CertificateError, CredentialsError) as exc:
            raise SecurityError(str(exc)) from None

    def _load_tls(self, tls: ListenerTlsFiles | None, upstream: UpstreamTlsFiles | None) -> None:
        if tls is not None:
            self.listener_tls = ListenerTls(tls)
            log.info("TLS on client listeners: %s", self.listener_tls.describe())
        if upstream is not None:
            self.upstream_tls = UpstreamTls(upstream)
            log.info(
                "TLS toward brokers: CA %s, names checked against %s%s",
                upstream.ca,
                upstream.server_name or "each broker's host",
                f", client certificate {upstream.cert}" if upstream.cert else "",
            )

    def _load_sasl(self, credentials: str | None, upstream: str | None) -> None:
        if upstream is not None:
            self.upstream_logins = load_upstream_logins(upstream)
            log.info(
                "SASL toward brokers: logins for %s (%s)",
                ", ".join(self.upstream_logins.logins) or "no principal",
                upstream,
            )
        if credentials is not None:
            if self.upstream_logins is None:
                raise SecurityError(
                    "--sasl-credentials needs --sasl-upstream: kipside logs in to the "
                    "brokers as each client principal, so it needs their upstream logins"
                )
            self.sasl_credentials = load_credentials(credentials)
            log.info(
                "SASL toward clients: kipside authenticates %d users (%s)",
                len(self.sasl_credentials.users),
                credentials,
            )

    async def accept(self, stream: trio.SocketStream) -> tuple[Wire, Principal] | None:
        """The client's connection and who it is: TLS (and its certificate's principal) on a
        TLS listener; None if its TLS handshake failed (logged, closed)."""
        if self.listener_tls is None:
            return Wire.from_stream(stream), ANONYMOUS
        host, port = stream.socket.getsockname()[:2]
        try:
            wire = await self.listener_tls.accept(stream, f"{host}:{port}")
        except TlsError as exc:
            log.log(logging.DEBUG if exc.routine else logging.WARNING, "%s", exc)
            return None
        return wire, self.listener_tls.principal(wire)

    async def dial(self, address: Address, principal: Principal) -> Wire:
        """A connection to a broker for `principal`'s traffic: TLS with --upstream-ca, then
        a SASL login with the principal's --sasl-upstream entry, if it has one."""
        wire: Wire
        if self.upstream_tls is not None:
            wire = await self.upstream_tls.connect(address)
        else:
            wire = await plain_dial(address)
        logins = self.upstream_logins
        login = None if logins is None else logins.for_principal(principal)
        if login is not None:  # SASL after TLS, as a Kafka client logs in
            try:
                await log_in(wire, login, address)
            except BaseException:
                wire.close()
                raise
        return wire

    def kipside_principal(self) -> Principal:
        """Who kipside's own requests (node discovery) are: --sasl-upstream's `discovery`."""
        logins = self.upstream_logins
        if logins is None or logins.discovery is None:
            return ANONYMOUS
        return Principal(logins.discovery, "sasl")

    def sasl_termination(self) -> Termination | None:
        """How kipside authenticates clients' SASL itself; None: it passes through."""
        store, logins = self.sasl_credentials, self.upstream_logins
        if store is None:
            return None
        return Termination(
            store.lookup,
            lambda principal: logins is not None and logins.for_principal(principal) is not None,
            store.source,
            None if logins is None else logins.source,
        )
