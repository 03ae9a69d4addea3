"""TLS on kipside's Wire: the same synchronous ordered writes, encrypted.

`TlsWire` is a `Wire` whose bytes pass through a sans-I/O `ssl.SSLObject` (OpenSSL over two
memory BIOs) on their way to and from the same socket. What Wire promises still holds:

- `write(chunks)` encrypts the chunks at once, in the caller's task, as one TLS write (so many
  small frames make few TLS records), and hands the ciphertext to Wire's own write: one send
  now, the rest in order in the backlog. Whatever TLS itself wants to send (a handshake
  message, a reply to a key update, session tickets) is taken out of the BIO right after the
  call that produced it and written the same way, so ciphertext leaves in the order OpenSSL
  made it, and a frame is still never interleaved with another.
- `receive()` waits for ciphertext as Wire does, decrypts everything the kernel handed over and
  returns the plaintext; b"" at the end of the stream (a close_notify, a closed socket or a TLS
  error, then `broken_reason` says which).

`accept` (a client connecting to a TLS listener) and `connect` (kipside to a TLS broker) run
the handshake with a deadline and turn every way it can fail into a `TlsError` whose message
says what happened, on which connection, and which option or client setting to change. This
module never reads files: the SSL contexts come from security.certificates. A plaintext Wire
runs none of this code.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Final

import trio

from kipside.protocol import Address, Buffer, sniff_kafka_request
from kipside.proxy.transport.wire import READ_SIZE, Wire, WireBroken

HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0
# A TLS record: content type 20-23 (change_cipher_spec, alert, handshake, application data),
# then protocol version major 3.
_TLS_CONTENT_TYPES: Final = range(20, 24)


class TlsError(ConnectionError):
    """A TLS connection could not be set up; the message says why and what to change.

    An OSError, so every caller that handles a failed dial (UpstreamConnection.open, upstream
    discovery) reports it as it reports a refused connection."""

    def __init__(self, message: str, *, routine: bool = False) -> None:
        super().__init__(message)
        self.routine = routine
        """Nothing to fix: a client that left during its handshake (a TCP health check, a
        client shutting down); a client that rejects kipside's certificate says so first."""


def looks_like_tls(head: bytes) -> bool:
    """Whether a stream starts like TLS (a record header), as far as its first byte shows."""
    return len(head) >= 1 and head[0] in _TLS_CONTENT_TYPES and (len(head) < 2 or head[1] == 3)


class TlsWire(Wire):
    """A Wire carrying TLS: encrypts on write, decrypts on receive (see the module doc)."""

    __slots__ = ("_incoming", "_outgoing", "_tls", "_tls_ended")

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        super().__init__(sock)
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
        )
        self._tls_ended = False

    @property
    def tls(self) -> ssl.SSLObject:
        """The TLS state: version, cipher, the peer's certificate."""
        return self._tls

    # The handshake ---------------------------------------------------------------------

    async def handshake(self, check_first: Callable[[bytes], None] | None = None) -> None:
        """Complete the TLS handshake. `check_first` sees the first bytes the peer sends and may
        raise (to name a peer that is not speaking TLS). Raises ssl.SSLError when TLS fails,
        EOFError when the peer closes first; the caller words either and sets the deadline."""
        first = True
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLError as exc:
                if not isinstance(exc, ssl.SSLWantReadError):
                    # The alert that says why (e.g. "certificate required") goes out first.
                    with contextlib.suppress(WireBroken):
                        self._send_tls_output()
                    raise
                self._send_tls_output()
                await self._flush_backlog()
                data = await Wire.receive(self)
                if not data:
                    raise EOFError(self.broken_reason or "closed the connection") from None
                if first and check_first is not None:
                    check_first(data)
                first = False
                self._incoming.write(data)
                continue
            self._send_tls_output()
            return

    async def _flush_backlog(self) -> None:
        # Before the connection's flusher task runs: a handshake message the kernel did not
        # take at once must still leave before we wait for the answer.
        while self.backlog_bytes and not self.closed:
            await self._flush_some()

    # Reading ---------------------------------------------------------------------------

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self._incoming.pending or self._tls.pending():
            # Read with the handshake's last record (a client's first request often is), or
            # left over by a read that reached max_bytes.
            plaintext = self._decrypt(max_bytes)
            if plaintext:
                await trio.lowlevel.checkpoint()
                return plaintext
        while True:
            if self._tls_ended:
                await trio.lowlevel.checkpoint()
                return b""
            ciphertext = await Wire.receive(self, max_bytes)
            if not ciphertext:
                return b""
            self._incoming.write(ciphertext)
            plaintext = self._decrypt(max_bytes)
            if plaintext:
                return plaintext

    def _decrypt(self, max_bytes: int) -> bytes:
        """Every whole record's plaintext the incoming BIO holds (up to max_bytes)."""
        pieces: list[bytes] = []
        size = 0
        tls = self._tls
        try:
            while size < max_bytes:
                piece = tls.read(max_bytes - size)
                if not piece:  # the peer's close_notify: the end of the stream
                    self._tls_ended = True
                    break
                pieces.append(piece)
                size += len(piece)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self._tls_ended = True
        except ssl.SSLError as exc:
            self._tls_ended = True
            self.broken_reason = f"TLS error: {exc.reason or exc}"
        with contextlib.suppress(WireBroken):  # the next write reports it
            self._send_tls_output()  # e.g. the answer to a key update
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    # Writing ---------------------------------------------------------------------------

    def write(self, chunks: Sequence[Buffer]) -> None:
        if self.closed:
            raise WireBroken(self.broken_reason or "connection closed")
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            reason = f"TLS error: {exc.reason or exc}"
            self._break(reason)
            raise WireBroken(reason) from exc
        self._send_tls_output()

    def _send_tls_output(self) -> None:
        if self._outgoing.pending:
            Wire.write(self, (self._outgoing.read(),))

    # Closing ---------------------------------------------------------------------------

    async def send_eof(self) -> None:
        """close_notify, then half-close: the peer sees the end of what we send."""
        if not self.closed and not self._tls_ended:
            try:
                self._tls.unwrap()
            except ssl.SSLWantReadError:
                pass  # close_notify is written; the peer's comes later, if ever
            except ssl.SSLError:
                pass
            try:
                self._send_tls_output()
            except WireBroken:
                return
        await super().send_eof()

    def close(self) -> None:
        """Close now; a close_notify first if nothing is queued before it (best effort: some
        clients, asyncio's among them, wait for it before they finish closing)."""
        if not self.closed and not self.backlog_bytes:
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()  # SSLWantReadError once close_notify is written
            with contextlib.suppress(OSError):
                if self._outgoing.pending:
                    self._sock.send(self._outgoing.read())
        super().close()


# Accepting and connecting ----------------------------------------------------------------


def _socket_of(stream: trio.SocketStream) -> socket.socket:
    return socket.socket(fileno=stream.socket.detach())


async def accept(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    *,
    listener: str,
    client_ca: str | None,
) -> TlsWire:
    """The TLS connection of a client that connected to TLS listener `listener`.

    Raises TlsError naming the client, the listener and the fix (the stream is closed)."""
    wire = TlsWire(_socket_of(stream), context, server_side=True)
    client = f"client {wire.peername()}"

    def plaintext_check(head: bytes) -> None:
        if looks_like_tls(head):
            return
        request = sniff_kafka_request(head)
        if request is not None:
            raise TlsError(
                f"{client} sent plaintext Kafka ({request}) to the TLS listener {listener}; "
                "configure the client with security.protocol=SSL (and the CA that signed "
                "kipside's --tls-cert in ssl.ca.location)"
            )
        raise TlsError(
            f"{client} sent bytes that are not TLS ({bytes(head[:8]).hex(' ')}) to the TLS "
            f"listener {listener}; this port expects a TLS ClientHello (security.protocol=SSL)"
        )

    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
            await wire.handshake(plaintext_check)
    except trio.TooSlowError:
        wire.close()
        raise TlsError(
            f"{client} did not complete the TLS handshake on {listener} within "
            f"{HANDSHAKE_TIMEOUT_SECONDS:g} s; "
            "closing it"
        ) from None
    except EOFError as exc:
        wire.close()
        raise TlsError(
            f"{client} closed the connection during the TLS handshake on {listener} ({exc})",
            routine=True,
        ) from None
    except ssl.SSLError as exc:
        wire.close()
        why = _why(exc, client_ca)
        raise TlsError(f"{client} refused on the TLS listener {listener}: {why}") from None
    except BaseException:
        wire.close()
        raise
    return wire


def _why(exc: ssl.SSLError, client_ca: str | None) -> str:
    """A client's failed handshake, in words a user can act on."""
    reason = str(exc.reason or exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its certificate did not verify against --tls-client-ca {client_ca}: "
            f"{exc.verify_message}; give it a certificate signed by that CA "
            "(ssl.certificate.location, ssl.key.location)"
        )
    if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason:
        return (
            f"it sent no client certificate, and --tls-client-ca {client_ca} requires one "
            "(mTLS); give it a certificate signed by that CA (ssl.certificate.location, "
            "ssl.key.location)"
        )
    if "ALERT" in reason:
        return (
            f"it rejected kipside's certificate (TLS alert: {reason}); give it the CA that "
            "signed --tls-cert (ssl.ca.location) and a name in that certificate"
        )
    if "VERSION" in reason or "PROTOCOL" in reason:
        return f"{reason}: kipside accepts TLS 1.2 and 1.3 only"
    return reason


async def connect(
    address: Address,
    context: ssl.SSLContext,
    *,
    server_name: str | None,
    ca_file: str,
) -> TlsWire:
    """A TLS connection to the broker at `address`, its certificate checked against
    `server_name` (or the address's host) and sent as SNI. Raises TlsError (or OSError when the
    broker cannot be reached at all)."""
    name = server_name or address.host
    stream = await trio.open_tcp_stream(address.host, address.port)
    wire = TlsWire(_socket_of(stream), context, server_side=False, server_hostname=name)
    # Callers name the broker ("HOST:PORT: ..."); these messages say what happened to it.
    hint = (
        "is it a plaintext listener? --upstream-ca turns TLS on toward every broker: "
        "point --upstream at the brokers' TLS listeners, or drop --upstream-ca"
    )

    def plaintext_check(head: bytes) -> None:
        if not looks_like_tls(head):
            raise TlsError(f"answered the TLS ClientHello with bytes that are not TLS; {hint}")

    # Within the caller's own deadline (a dial has one), so this message wins over its timeout.
    remaining = trio.current_effective_deadline() - trio.current_time()
    limit = min(HANDSHAKE_TIMEOUT_SECONDS, remaining * 0.9)
    try:
        with trio.fail_after(limit):
            await wire.handshake(plaintext_check)
    except trio.TooSlowError:
        wire.close()
        raise TlsError(f"no TLS handshake completed within {limit:.2g} s; {hint}") from None
    except EOFError as exc:
        wire.close()
        raise TlsError(f"closed the connection during the TLS handshake ({exc}); {hint}") from None
    except ssl.SSLCertVerificationError as exc:
        wire.close()
        checked = f"--upstream-server-name {server_name}" if server_name else f"the host {name}"
        raise TlsError(
            f"the broker's certificate did not verify: {exc.verify_message} (checked "
            f"against {checked}, CA file --upstream-ca {ca_file}); set --upstream-server-name "
            "to a name the broker's certificate holds, or --upstream-ca to the CA that signed it"
        ) from None
    except ssl.SSLError as exc:
        wire.close()
        reason = str(exc.reason or exc)
        more = (
            "; the broker may require a client certificate (--upstream-cert, --upstream-key)"
            if "CERTIFICATE" in reason
            else ""
        )
        raise TlsError(f"refused kipside's TLS handshake: {reason}{more}") from None
    except BaseException:
        wire.close()
        raise
    return wire
