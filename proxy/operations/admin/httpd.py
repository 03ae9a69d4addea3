"""The admin endpoint's HTTP/1.1 server: h11 over trio, one request per connection.

One h11 connection object per client, sans-I/O style: bytes in, events out. Headers (16 KiB)
and bodies (64 KiB) are capped, a client that has not finished within the request deadline is
cut off (408), malformed HTTP gets 400, more than MAX_CONNECTIONS at once get 503, and a
listener off loopback is logged as a warning (the endpoint has no authentication).

It knows nothing of kipside: a `Handle` turns (method, target, body) into a `Reply`. It must
never let one client's request, slow or broken, cost more than that client's connection.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

import h11
import trio

log = logging.getLogger("kipside.admin")

MAX_HEADER_BYTES: Final = 16 * 1024
MAX_BODY_BYTES: Final = 64 * 1024
REQUEST_DEADLINE_SECONDS: Final = 10.0
"""From accepting a connection to the last byte of the reply."""
MAX_CONNECTIONS: Final = 64
"""Admin connections served at once; more are answered 503 straight away."""
LINGER_SECONDS: Final = 1.0
"""After answering a request we did not read in full (413, 400, 408): how long to read and
discard what the client still sends, so closing does not reset the answer away."""
RECEIVE_BYTES: Final = 8192

TEXT: Final = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()


Handle = Callable[[bytes, bytes, bytes], Awaitable[Reply]]
"""(method, target, body) -> the reply; an exception in it is the caller's 500, not ours."""


@dataclass(frozen=True, slots=True)
class _Request:
    method: bytes
    target: bytes
    body: bytes


class _TooLarge(Exception):
    pass


async def _receive_request(
    stream: trio.abc.HalfCloseableStream, conn: h11.Connection
) -> _Request | None:
    """The next whole request, or None if the client closed before sending one.

    Raises h11.RemoteProtocolError for malformed HTTP and _TooLarge for a body over the cap.
    """
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue:
                await stream.send_all(
                    conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                )
            conn.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
        elif isinstance(event, h11.Request):
            head = event
            _check_head(event)
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise _TooLarge
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return _Request(head.method, head.target, bytes(body))
        else:  # ConnectionClosed before a request
            return None


def _check_head(request: h11.Request) -> None:
    # h11 caps only a head still incomplete; one that arrived whole is measured here.
    size = len(request.method) + len(request.target) + 16
    size += sum(len(name) + len(value) + 4 for name, value in request.headers)
    if size > MAX_HEADER_BYTES:
        raise h11.RemoteProtocolError(
            f"request head over {MAX_HEADER_BYTES} bytes", error_status_hint=431
        )
    for name, value in request.headers:
        # h11 has checked it is one well-formed number.
        if name == b"content-length" and int(value) > MAX_BODY_BYTES:
            raise _TooLarge


async def _send_reply(
    stream: trio.abc.HalfCloseableStream,
    conn: h11.Connection,
    reply: Reply,
    head_only: bool = False,
) -> None:
    headers = [
        ("content-type", reply.content_type),
        ("content-length", str(len(reply.body))),
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
        ("connection", "close"),
        *reply.headers,
    ]
    reason = HTTPStatus(reply.status).phrase.encode()
    data = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=reason)) or b""
    if not head_only:
        data += conn.send(h11.Data(data=reply.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)


async def _linger_and_close(stream: trio.abc.HalfCloseableStream) -> None:
    with trio.move_on_after(LINGER_SECONDS):
        try:
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_BYTES):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


async def serve_connection(
    stream: trio.abc.HalfCloseableStream, handle: Handle, deadline: float
) -> None:
    """Read one request, answer it, close; within `deadline` seconds or a 408."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    error: Reply | None = None
    try:
        with trio.move_on_after(deadline) as scope:
            try:
                request = await _receive_request(stream, conn)
            except h11.RemoteProtocolError as exc:
                error = Reply(exc.error_status_hint, f"bad request: {exc}\n".encode())
            except _TooLarge:
                error = Reply(413, f"request body over {MAX_BODY_BYTES} bytes\n".encode())
            else:
                if request is not None:
                    reply = await handle(request.method, request.target, request.body)
                    await _send_reply(stream, conn, reply, head_only=request.method == b"HEAD")
            if error is not None and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send_reply(stream, conn, error)
        if scope.cancelled_caught and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            timeout = f"request not complete within {deadline:g} s\n"
            with trio.move_on_after(LINGER_SECONDS):
                await _send_reply(stream, conn, Reply(408, timeout.encode()))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:
        # A bug here must cost one admin request, never the proxy.
        log.exception("admin: unexpected error")
    if conn.their_state is h11.DONE:
        await trio.aclose_forcefully(stream)
    else:
        await _linger_and_close(stream)


async def _refuse_busy(stream: trio.abc.HalfCloseableStream) -> None:
    conn = h11.Connection(h11.SERVER)
    with trio.move_on_after(LINGER_SECONDS):
        try:
            reply = Reply(503, f"busy: {MAX_CONNECTIONS} admin connections open\n".encode())
            await _send_reply(stream, conn, reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await _linger_and_close(stream)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def serve_http(
    listener: trio.SocketListener, handle: Handle, deadline: float = REQUEST_DEADLINE_SECONDS
) -> None:
    """Serve connections on `listener` until cancelled, at most MAX_CONNECTIONS at once."""
    host = str(listener.socket.getsockname()[0])
    if not is_loopback(host):
        log.warning(
            "the admin endpoint listens on %s, which is not loopback: anyone who can reach it "
            "can read the metrics and trigger rule reloads (it has no authentication)",
            host,
        )
    open_connections = 0

    async def handler(stream: trio.abc.HalfCloseableStream) -> None:
        nonlocal open_connections
        if open_connections >= MAX_CONNECTIONS:
            await _refuse_busy(stream)
            return
        open_connections += 1
        try:
            await serve_connection(stream, handle, deadline)
        finally:
            open_connections -= 1

    await trio.serve_listeners(handler, [listener])
