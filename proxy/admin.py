"""The HTTP admin endpoint (h11 over trio): health, readiness and Prometheus metrics.

One h11 connection object per client, sans-I/O style: bytes in, events out. Requests are small
GETs; bodies and headers are capped, a slow client is cut off after a deadline, malformed HTTP
gets 400 and unknown paths 404. It binds to loopback unless told otherwise, and it must never
block or slow the Kafka traffic it reports on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

import h11
import trio

from protocol.apis import api_name

from .stats import Stats

log = logging.getLogger("kipside.admin")

MAX_HEADER_BYTES = 16 * 1024
REQUEST_DEADLINE_SECONDS = 10.0
BUILD_VERSION = "0.1.0"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def render_metrics(stats: Stats) -> str:
    lines = [
        "# HELP kipside_build_info kipside build information.",
        "# TYPE kipside_build_info gauge",
        f'kipside_build_info{{version="{BUILD_VERSION}"}} 1',
        "# HELP kipside_client_requests_total Requests received from clients.",
        "# TYPE kipside_client_requests_total counter",
    ]
    lines += [
        f'kipside_client_requests_total{{api="{api_name(k)}"}} {v}'
        for k, v in sorted(stats.client_requests.items())
    ]
    lines += [
        "# HELP kipside_upstream_requests_total Requests sent to brokers "
        "(a coalesced ProduceRequest counts once).",
        "# TYPE kipside_upstream_requests_total counter",
    ]
    lines += [
        f'kipside_upstream_requests_total{{api="{api_name(k)}"}} {v}'
        for k, v in sorted(stats.upstream_requests.items())
    ]
    lines += [
        "# HELP kipside_coalesced_batches_total Partition batches sent in coalesced requests.",
        "# TYPE kipside_coalesced_batches_total counter",
        f"kipside_coalesced_batches_total {stats.coalesced_batches}",
        "# HELP kipside_client_connections Open client connections.",
        "# TYPE kipside_client_connections gauge",
        f"kipside_client_connections {stats.client_connections}",
        "# HELP kipside_upstream_connections Open broker connections.",
        "# TYPE kipside_upstream_connections gauge",
        f"kipside_upstream_connections {stats.upstream_connections}",
        "# HELP kipside_lane_failures_total Shared broker connections that ended.",
        "# TYPE kipside_lane_failures_total counter",
        f"kipside_lane_failures_total {stats.lane_failures}",
    ]
    return "\n".join(lines) + "\n"


class AdminApp:
    """Routes admin requests to replies; pure apart from reading the server's state."""

    def __init__(self, stats: Stats, is_ready: Callable[[], bool]) -> None:
        self.stats = stats
        self.is_ready = is_ready

    def handle(self, method: bytes, target: bytes) -> Reply:
        path = target.split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return Reply(405, b"method not allowed\n")
        if path == b"/healthz":
            return Reply(200, b"ok\n")
        if path == b"/readyz":
            return Reply(200, b"ready\n") if self.is_ready() else Reply(503, b"not ready\n")
        if path == b"/metrics":
            return Reply(
                200,
                render_metrics(self.stats).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        return Reply(404, b"not found\n")


async def _send_reply(
    stream: trio.SocketStream, conn: h11.Connection, reply: Reply, head_only: bool
) -> None:
    headers = [
        ("content-type", reply.content_type),
        ("content-length", str(len(reply.body))),
        ("connection", "close"),
    ]
    reason = HTTPStatus(reply.status).phrase.encode()
    data = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=reason))
    if not head_only:
        data = (data or b"") + (conn.send(h11.Data(data=reply.body)) or b"")
    data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
    await stream.send_all(data)


async def serve_admin_connection(stream: trio.SocketStream, app: AdminApp) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    with trio.move_on_after(REQUEST_DEADLINE_SECONDS):
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(8192)
                    conn.receive_data(data)
                    if not data and conn.their_state is not h11.DONE:
                        break
                    continue
                if isinstance(event, h11.Request):
                    reply = app.handle(event.method, event.target)
                    await _send_reply(stream, conn, reply, event.method == b"HEAD")
                    break
                break
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                body = f"bad request: {exc}\n".encode()
                await _send_reply(stream, conn, Reply(status, body), head_only=False)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)
