"""One blocking connection to one broker: a plain socket driving protocol.client.

This is the shell the way h11's docs show a plain-socket client driving h11: protocol/ decides
(framing, correlation ids, order), this module only moves bytes, with a deadline on every
connect, write and read so a silent network partition becomes an error, never a hang. It runs in
Spark's Python workers and driver, where there is no event loop, so it is deliberately
synchronous. It never decodes a body.

With TLS (an `ssl.SSLContext` from pipeline.kafka.security) the socket is wrapped after the
connect, the broker's host name sent as SNI and, unless turned off, checked against its
certificate. A certificate the trust store refuses is SecurityError (retrying won't fix it);
anything else that breaks a handshake is ConnectionFailed, as any broken connection.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence

from kipside.protocol import Address, Buffer, ClientConnection, ProtocolError, Response

from .errors import SecurityError

__all__ = ["BrokerConnection", "ConnectionFailed"]

_READ_SIZE = 1 << 20
_IOV_MAX = 512  # well under Linux's 1024 iovecs per sendmsg
_TLS_JOIN = 64 * 1024  # small chunks are joined into one TLS write up to this


class ConnectionFailed(OSError):
    """The broker could not be reached, or the connection broke or timed out mid-request."""


class BrokerConnection:
    """A connected socket to one broker; requests are answered in the order they were sent."""

    def __init__(
        self,
        address: Address,
        *,
        client_id: str,
        connect_timeout: float,
        request_timeout: float,
        name: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.name = name or f"broker {address}"
        self.request_timeout = request_timeout
        self._protocol = ClientConnection(client_id)
        try:
            sock = socket.create_connection((address.host, address.port), timeout=connect_timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {self.name}: {_reason(exc)}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls = tls is not None
        self._sock: socket.socket | None = sock
        if tls is not None:
            self._sock = self._handshake(sock, tls)

    def _handshake(self, sock: socket.socket, tls: ssl.SSLContext) -> ssl.SSLSocket:
        try:
            return tls.wrap_socket(sock, server_hostname=self.address.host)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise SecurityError(
                f"TLS handshake with {self.name}: its certificate is refused: "
                f"{exc.verify_message or exc.reason}. Check ssl.truststore.location (the CA "
                "that signed the brokers' certificates) and the broker's address (checked "
                "against the certificate unless ssl.endpoint.identification.algorithm is empty)"
            ) from None
        except OSError as exc:
            sock.close()
            raise ConnectionFailed(
                f"TLS handshake with {self.name} failed: {_reason(exc)} (is it a TLS listener? "
                "security.protocol says SSL or SASL_SSL)"
            ) from exc

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send(self, api_key: int, api_version: int, body: Sequence[Buffer] | Buffer) -> None:
        """Write one request; its response comes from a later `receive()`, in send order.

        The chunks go out with scatter-gather writes, so big record batches are never joined.
        """
        chunks = self._protocol.send_request(api_key, api_version, body)
        sock = self._live()
        deadline = time.monotonic() + self.request_timeout
        views = [memoryview(c).cast("B") for c in chunks if len(c)]
        if self._tls:
            self._send_tls(sock, views, deadline)
            return
        first = 0
        try:
            while first < len(views):
                sock.settimeout(_remaining(deadline))
                sent = sock.sendmsg(views[first : first + _IOV_MAX])
                while sent:
                    head = views[first]
                    if sent >= len(head):
                        sent -= len(head)
                        first += 1
                    else:
                        views[first] = head[sent:]
                        sent = 0
        except OSError as exc:
            self._fail()
            raise ConnectionFailed(f"writing to {self.name} failed: {_reason(exc)}") from exc

    def _send_tls(self, sock: socket.socket, views: list[memoryview], deadline: float) -> None:
        """TLS has no scatter-gather write: small chunks are joined, big ones written as they
        are (a record batch is never copied to be joined)."""
        pending = bytearray()
        try:
            for view in views:
                if len(view) >= _TLS_JOIN:
                    if pending:
                        sock.settimeout(_remaining(deadline))
                        sock.sendall(pending)
                        pending.clear()
                    sock.settimeout(_remaining(deadline))
                    sock.sendall(view)
                else:
                    pending += view
            if pending:
                sock.settimeout(_remaining(deadline))
                sock.sendall(pending)
        except OSError as exc:
            self._fail()
            raise ConnectionFailed(f"writing to {self.name} failed: {_reason(exc)}") from exc

    def receive(self, timeout: float | None = None) -> Response:
        """The answer to the oldest request in flight."""
        if self._protocol.in_flight == 0:
            raise RuntimeError(f"no request in flight on {self.name}")
        sock = self._live()
        deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
        while (response := self._protocol.next_response()) is None:
            try:
                sock.settimeout(_remaining(deadline))
                data = sock.recv(_READ_SIZE)
            except OSError as exc:
                self._fail()
                raise ConnectionFailed(f"reading from {self.name} failed: {_reason(exc)}") from exc
            if not data:
                self._fail()
                raise ConnectionFailed(f"{self.name} closed the connection mid-request")
            try:
                self._protocol.receive_data(data)
            except ProtocolError:
                self._fail()
                raise
        return response

    def request(
        self,
        api_key: int,
        api_version: int,
        body: Sequence[Buffer] | Buffer,
        timeout: float | None = None,
    ) -> Response:
        self.send(api_key, api_version, body)
        return self.receive(timeout)

    def _live(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionFailed(f"the connection to {self.name} is closed")
        return self._sock

    def _fail(self) -> None:
        # After a broken or timed-out read the stream position is unknown: never reuse it.
        self.close()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return exc.strerror or str(exc) or type(exc).__name__
