"""The HTTP admin endpoint (h11 over trio): health, readiness, metrics, rules and a status page.

One h11 connection object per client, sans-I/O style: bytes in, events out, one request per
connection. Headers (16 KiB) and bodies (64 KiB) are capped, a client that has not finished
within the request deadline is cut off, malformed HTTP gets 400, unknown paths 404 and a known
path with the wrong method 405. It binds to loopback unless told otherwise.

It must never block, slow or take down the Kafka traffic it reports on: it only reads the
server's counters, a failing handler becomes a 500 for that one request, and rule reloads go
through proxy.reload, which validates a file in full before anything changes.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Final, Protocol

import h11
import trio

from kipside.protocol.apis import ApiKey, api_name
from kipside.proxy.operations.reload import RuleReloader
from kipside.proxy.telemetry.metrics import BUILD_VERSION, render_metrics
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet

if TYPE_CHECKING:
    from kipside.proxy.server import ServerConfig

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
READY_PROBE_SECONDS: Final = 2.0
READY_REMEMBER_SECONDS: Final = 10.0
"""A broker that accepted a connection this recently still counts as reachable."""
RATE_SAMPLE_SECONDS: Final = 1.0
RATE_WINDOW_SAMPLES: Final = 6
"""Request rates are averaged over the last ~5 s."""
RECEIVE_BYTES: Final = 8192

TEXT: Final = "text/plain; charset=utf-8"
JSON: Final = "application/json"
HTML: Final = "text/html; charset=utf-8"
PROMETHEUS: Final = "text/plain; version=0.0.4; charset=utf-8"
# The status page is self-contained: inline style and script, fetches only from this origin.
PAGE_POLICY: Final = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()


def _json_reply(status: int, value: object) -> Reply:
    return Reply(status, (json.dumps(value, indent=2) + "\n").encode(), JSON)


class AdminSource(Protocol):
    """What the admin endpoint reads of the server (proxy.server.Server)."""

    @property
    def stats(self) -> Stats: ...
    @property
    def rules(self) -> RuleSet: ...
    @property
    def ready(self) -> trio.Event: ...
    @property
    def config(self) -> ServerConfig: ...
    @property
    def reloader(self) -> RuleReloader: ...


# Metrics --------------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_rule_metrics(rules: RuleSet, reloader: RuleReloader) -> str:
    lines = [
        "# HELP kipside_rules_info The rule set in force (version: first 12 hex digits of "
        "the SHA-256 of the file).",
        "# TYPE kipside_rules_info gauge",
        f'kipside_rules_info{{version="{_label(rules.version)}",'
        f'source="{_label(rules.source)}"}} 1',
        "# HELP kipside_rule_reloads_total Rule reloads that read a valid file "
        "(SIGHUP, file change or POST /rules/reload).",
        "# TYPE kipside_rule_reloads_total counter",
        f"kipside_rule_reloads_total {reloader.rule_reloads}",
        "# HELP kipside_rule_reload_errors_total Rule reloads rejected because the file was "
        "invalid or unreadable; the rules in force stayed.",
        "# TYPE kipside_rule_reload_errors_total counter",
        f"kipside_rule_reload_errors_total {reloader.rule_reload_errors}",
    ]
    return "\n".join(lines) + "\n"


# Request rates --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    client: Counter[int]
    upstream: Counter[int]


class RateWindow:
    """Per-API request rates over the last few samples of the cumulative counters."""

    def __init__(self, samples: int = RATE_WINDOW_SAMPLES) -> None:
        self._samples: deque[_Sample] = deque(maxlen=samples)

    def sample(self, now: float, stats: Stats) -> None:
        self._samples.append(
            _Sample(now, Counter(stats.client_requests), Counter(stats.upstream_requests))
        )

    def rates(
        self, now: float, stats: Stats
    ) -> tuple[float, dict[int, float], dict[int, float]] | None:
        """(window seconds, client rates, upstream rates by api key), or None before the
        first sample."""
        if not self._samples:
            return None
        oldest = self._samples[0]
        window = now - oldest.at
        if window <= 0:
            return None
        client = {k: (v - oldest.client[k]) / window for k, v in stats.client_requests.items()}
        upstream = {
            k: (v - oldest.upstream[k]) / window for k, v in stats.upstream_requests.items()
        }
        return window, client, upstream


def _ratio(client: float, upstream: float) -> float | None:
    return round(client / upstream, 2) if upstream > 0 else None


# The application ------------------------------------------------------------------------

Handler = Callable[[bytes], Awaitable[Reply]]


class AdminApp:
    """Routes admin requests to replies; reads the server's state, changes only its rules."""

    def __init__(
        self, server: AdminSource, *, request_deadline: float = REQUEST_DEADLINE_SECONDS
    ) -> None:
        self.server = server
        self.request_deadline = request_deadline
        self.rates = RateWindow()
        self.started_at = trio.current_time()
        self._upstream_ok_at: float | None = None
        get = (b"GET", b"HEAD")
        self.routes: dict[bytes, tuple[tuple[bytes, ...], Handler]] = {
            b"/": (get, self._status_page),
            b"/status.json": (get, self._status_json),
            b"/healthz": (get, self._healthz),
            b"/readyz": (get, self._readyz),
            b"/metrics": (get, self._metrics),
            b"/rules": (get, self._rules),
            b"/rules/reload": ((b"POST",), self._reload),
        }

    async def handle(self, method: bytes, target: bytes, body: bytes = b"") -> Reply:
        path = target.split(b"?", 1)[0]
        route = self.routes.get(path)
        if route is None:
            known = ", ".join(p.decode() for p in self.routes)
            return Reply(404, f"not found; this endpoint serves {known}\n".encode())
        methods, handler = route
        if method not in methods:
            allowed = ", ".join(m.decode() for m in methods)
            return Reply(
                405,
                f"method not allowed; {path.decode()} takes {allowed}\n".encode(),
                headers=(("allow", allowed),),
            )
        try:
            return await handler(body)
        except Exception:
            log.exception("admin: %s %s failed", method.decode(), path.decode(errors="replace"))
            return Reply(500, b"internal error; see kipside's log\n")

    async def sample_rates(self) -> None:
        while True:
            self.rates.sample(trio.current_time(), self.server.stats)
            await trio.sleep(RATE_SAMPLE_SECONDS)

    # Handlers ---------------------------------------------------------------------------

    async def _healthz(self, body: bytes) -> Reply:
        return Reply(200, b"ok\n")

    async def _readyz(self, body: bytes) -> Reply:
        server = self.server
        if not server.ready.is_set():
            return Reply(503, b"not ready: still discovering the upstream brokers\n")
        upstream_ok, upstream = await self._upstream_reachable()
        rules = f"rules version {server.rules.version} from {server.rules.source}"
        if not upstream_ok:
            return Reply(503, f"not ready: {upstream}; {rules}\n".encode())
        return Reply(200, f"ready: {upstream}; {rules}\n".encode())

    async def _upstream_reachable(self) -> tuple[bool, str]:
        stats = self.server.stats
        now = trio.current_time()
        if stats.upstream_connections > 0:
            self._upstream_ok_at = now
            return True, f"{stats.upstream_connections} broker connections open"
        if self._upstream_ok_at is not None and now - self._upstream_ok_at < READY_REMEMBER_SECONDS:
            return True, f"a broker accepted a connection {now - self._upstream_ok_at:.0f} s ago"
        problems = []
        for upstream in self.server.config.upstreams:
            try:
                with trio.fail_after(READY_PROBE_SECONDS):
                    stream = await trio.open_tcp_stream(upstream.host, upstream.port)
                await stream.aclose()
            except (OSError, trio.TooSlowError) as exc:
                problems.append(f"{upstream}: {exc or 'timed out'}")
                continue
            self._upstream_ok_at = trio.current_time()
            return True, f"broker {upstream} accepts connections"
        return False, "no broker connection open and no upstream accepts one (" + "; ".join(
            problems
        ) + ")"

    async def _metrics(self, body: bytes) -> Reply:
        server = self.server
        text = render_metrics(server.stats) + render_rule_metrics(server.rules, server.reloader)
        return Reply(200, text.encode(), PROMETHEUS)

    async def _rules(self, body: bytes) -> Reply:
        return _json_reply(200, self.server.rules.describe())

    async def _reload(self, body: bytes) -> Reply:
        result = await self.server.reloader.reload("POST /rules/reload")
        if result.outcome == "no-file":
            return _json_reply(
                409,
                result.describe()
                | {"error": "kipside was started without --rules FILE; there is nothing to reload"},
            )
        if result.outcome == "rejected":
            return _json_reply(
                422,
                result.describe()
                | {"error": f"the rule file is invalid; version {result.version} stays in force"},
            )
        return _json_reply(200, result.describe())

    async def _status_json(self, body: bytes) -> Reply:
        return _json_reply(200, self.status())

    async def _status_page(self, body: bytes) -> Reply:
        return Reply(
            200,
            STATUS_PAGE.encode(),
            HTML,
            headers=(("content-security-policy", PAGE_POLICY),),
        )

    def status(self) -> dict[str, object]:
        """The live figures of the status page."""
        server = self.server
        stats = server.stats
        rules = server.rules
        reloader = server.reloader
        now = trio.current_time()
        rates = self.rates.rates(now, stats)
        window, client_rates, upstream_rates = rates if rates is not None else (None, {}, {})
        apis = []
        for key in sorted(set(stats.client_requests) | set(stats.upstream_requests)):
            client_rate = client_rates.get(key)
            upstream_rate = upstream_rates.get(key)
            apis.append(
                {
                    "api": api_name(key),
                    "client_requests": stats.client_requests[key],
                    "upstream_requests": stats.upstream_requests[key],
                    "client_per_second": None if client_rate is None else round(client_rate, 1),
                    "upstream_per_second": (
                        None if upstream_rate is None else round(upstream_rate, 1)
                    ),
                }
            )
        produce_client = stats.client_requests[ApiKey.PRODUCE]
        produce_upstream = stats.upstream_requests[ApiKey.PRODUCE]
        return {
            "kipside_version": BUILD_VERSION,
            "uptime_seconds": round(now - self.started_at, 1),
            "ready": server.ready.is_set(),
            "connections": {
                "client": stats.client_connections,
                "upstream": stats.upstream_connections,
            },
            "rate_window_seconds": None if window is None else round(window, 1),
            "apis": apis,
            "produce": {
                "client_requests": produce_client,
                "upstream_requests": produce_upstream,
                "coalescing_ratio": _ratio(produce_client, produce_upstream),
                "recent_coalescing_ratio": _ratio(
                    client_rates.get(ApiKey.PRODUCE, 0.0), upstream_rates.get(ApiKey.PRODUCE, 0.0)
                ),
                "coalesced_batches": stats.coalesced_batches,
            },
            "holds": {"holds": stats.holds, "hold_retries": stats.hold_retries},
            "rules": {
                "version": rules.version,
                "source": rules.source,
                "loaded_at": datetime.fromtimestamp(reloader.loaded_at, UTC).isoformat(
                    timespec="seconds"
                ),
                "reloads": reloader.rule_reloads,
                "reload_errors": reloader.rule_reload_errors,
                "last_error": reloader.last_error,
            },
        }


# HTTP over trio -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    method: bytes
    target: bytes
    body: bytes


class _TooLarge(Exception):
    pass


async def _receive_request(stream: trio.SocketStream, conn: h11.Connection) -> _Request | None:
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
            conn.receive_data(await stream.receive_some(RECEIVE_BYTES))
        elif isinstance(event, h11.Request):
            head = event
            # h11 caps only a head still incomplete; one that arrived whole is measured here.
            size = len(event.method) + len(event.target) + 16
            size += sum(len(name) + len(value) + 4 for name, value in event.headers)
            if size > MAX_HEADER_BYTES:
                raise h11.RemoteProtocolError(
                    f"request head over {MAX_HEADER_BYTES} bytes", error_status_hint=431
                )
            for name, value in event.headers:
                # h11 has checked it is one well-formed number.
                if name == b"content-length" and int(value) > MAX_BODY_BYTES:
                    raise _TooLarge
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise _TooLarge
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return _Request(head.method, head.target, bytes(body))
        else:  # ConnectionClosed before a request
            return None


async def _send_reply(
    stream: trio.SocketStream, conn: h11.Connection, reply: Reply, head_only: bool = False
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


async def _linger_and_close(stream: trio.SocketStream) -> None:
    with trio.move_on_after(LINGER_SECONDS):
        try:
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_BYTES):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


async def serve_admin_connection(stream: trio.SocketStream, app: AdminApp) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    error: Reply | None = None
    try:
        with trio.move_on_after(app.request_deadline) as deadline:
            try:
                request = await _receive_request(stream, conn)
            except h11.RemoteProtocolError as exc:
                error = Reply(exc.error_status_hint, f"bad request: {exc}\n".encode())
            except _TooLarge:
                error = Reply(413, f"request body over {MAX_BODY_BYTES} bytes\n".encode())
            else:
                if request is not None:
                    reply = await app.handle(request.method, request.target, request.body)
                    await _send_reply(stream, conn, reply, head_only=request.method == b"HEAD")
            if error is not None and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send_reply(stream, conn, error)
        if deadline.cancelled_caught and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            timeout = f"request not complete within {app.request_deadline:g} s\n"
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


async def _refuse_busy(stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    with trio.move_on_after(LINGER_SECONDS):
        try:
            reply = Reply(503, f"busy: {MAX_CONNECTIONS} admin connections open\n".encode())
            await _send_reply(stream, conn, reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await _linger_and_close(stream)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def serve_admin(listener: trio.SocketListener, app: AdminApp) -> None:
    """Serve admin connections (and sample request rates) until cancelled."""
    host = str(listener.socket.getsockname()[0])
    if not _is_loopback(host):
        log.warning(
            "the admin endpoint listens on %s, which is not loopback: anyone who can reach it "
            "can read the metrics and trigger rule reloads (it has no authentication)",
            host,
        )
    open_connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal open_connections
        if open_connections >= MAX_CONNECTIONS:
            await _refuse_busy(stream)
            return
        open_connections += 1
        try:
            await serve_admin_connection(stream, app)
        finally:
            open_connections -= 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.sample_rates)
        await trio.serve_listeners(handler, [listener], handler_nursery=nursery)


# The status page --------------------------------------------------------------------------

STATUS_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>kipside status</title>
<style>
  :root { color-scheme: light dark; --fg: #1d2329; --muted: #5f6b76; --bg: #f6f7f9;
          --card: #fff; --line: #dde1e6; --accent: #0b6bcb; --bad: #c0392b; --good: #1e8449; }
  @media (prefers-color-scheme: dark) {
    :root { --fg: #e6e9ed; --muted: #9aa5b1; --bg: #14181c; --card: #1d2329; --line: #2e363e;
            --accent: #5aa9f0; --bad: #ef6f61; --good: #58c281; } }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 24px; font: 15px/1.45 system-ui, -apple-system, "Segoe UI",
         Roboto, sans-serif; color: var(--fg); background: var(--bg); }
  header { display: flex; align-items: baseline; gap: 16px; flex-wrap: wrap;
           margin-bottom: 20px; }
  h1 { font-size: 22px; margin: 0; }
  h2 { font-size: 15px; margin: 28px 0 8px; color: var(--muted); font-weight: 600; }
  #state { font-weight: 600; color: var(--muted); }
  #state.live { color: var(--good); }
  #state.bad { color: var(--bad); }
  .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr));
           gap: 12px; }
  .card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
          padding: 14px 16px; }
  .card .label { color: var(--muted); font-size: 13px; }
  .card .value { font-size: 28px; font-weight: 650; font-variant-numeric: tabular-nums;
                 margin-top: 2px; word-break: break-all; }
  .card .value.code { font: 600 21px/1.6 ui-monospace, "SFMono-Regular", Menlo, monospace; }
  .card .note { color: var(--muted); font-size: 12px; margin-top: 2px;
                overflow-wrap: anywhere; }
  table { border-collapse: collapse; width: 100%; background: var(--card);
          border: 1px solid var(--line); border-radius: 8px; overflow: hidden; }
  th, td { padding: 7px 12px; border-bottom: 1px solid var(--line); text-align: right;
           font-variant-numeric: tabular-nums; }
  th:first-child, td:first-child { text-align: left; }
  th { color: var(--muted); font-weight: 600; font-size: 13px; }
  tr:last-child td { border-bottom: none; }
  #rules-error { color: var(--bad); white-space: pre-wrap; font-family: ui-monospace,
                 monospace; font-size: 13px; }
  footer { margin-top: 28px; color: var(--muted); font-size: 13px; }
  a { color: var(--accent); }
</style>
</head>
<body data-updates="0">
<header>
  <h1>kipside</h1>
  <span id="state">waiting for the first figures...</span>
  <span id="updated"></span>
</header>
<noscript><p>This page needs JavaScript to fill in its figures; the same figures are at
<a href="/status.json">/status.json</a> and <a href="/metrics">/metrics</a>.</p></noscript>
<section class="cards">
  <div class="card"><div class="label">Client connections</div>
    <div class="value" id="client-connections">&ndash;</div>
    <div class="note">open now</div></div>
  <div class="card"><div class="label">Broker connections</div>
    <div class="value" id="upstream-connections">&ndash;</div>
    <div class="note">lanes and per-client connections</div></div>
  <div class="card"><div class="label">Coalescing ratio</div>
    <div class="value" id="coalescing-ratio">&ndash;</div>
    <div class="note" id="coalescing-note">client Produce requests per upstream one</div></div>
  <div class="card"><div class="label">Transaction-begin holds</div>
    <div class="value" id="holds">&ndash;</div>
    <div class="note" id="hold-retries"></div></div>
  <div class="card"><div class="label">Rule version</div>
    <div class="value code" id="rules-version">&ndash;</div>
    <div class="note" id="rules-source"></div></div>
</section>
<div id="rules-error"></div>
<h2>Requests per API <span id="window"></span></h2>
<table>
  <thead><tr><th>API</th><th>client req/s</th><th>upstream req/s</th>
    <th>client total</th><th>upstream total</th></tr></thead>
  <tbody id="apis"><tr><td colspan="5">no requests yet</td></tr></tbody>
</table>
<footer>
  <span id="uptime"></span> &middot;
  <a href="/status.json">status.json</a> &middot; <a href="/metrics">metrics</a> &middot;
  <a href="/rules">rules</a> &middot; <a href="/readyz">readyz</a>
</footer>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const num = (x, digits) => (x === null || x === undefined) ? "\\u2013" : x.toFixed(digits);
function text(id, value) { $(id).textContent = String(value); }

function render(s) {
  text("client-connections", s.connections.client);
  text("upstream-connections", s.connections.upstream);
  const p = s.produce;
  text("coalescing-ratio", p.coalescing_ratio === null ? "\\u2013" : p.coalescing_ratio + " : 1");
  text("coalescing-note", p.client_requests + " client / " + p.upstream_requests +
       " upstream Produce requests; last " + (s.rate_window_seconds || 0) + " s: " +
       (p.recent_coalescing_ratio === null ? "\\u2013" : p.recent_coalescing_ratio + " : 1"));
  text("holds", s.holds.holds);
  text("hold-retries", s.holds.hold_retries + " retries while holding");
  text("rules-version", s.rules.version);
  text("rules-source", s.rules.source + " \\u00b7 loaded " + s.rules.loaded_at + " \\u00b7 " +
       s.rules.reloads + " reloads, " + s.rules.reload_errors + " rejected");
  text("rules-error", s.rules.last_error ?
       "Last reload rejected (the version above stays in force):\\n" + s.rules.last_error : "");
  text("window", s.rate_window_seconds ? "(last " + s.rate_window_seconds + " s)" : "");
  const body = $("apis");
  const rows = s.apis.map((a) => {
    const tr = document.createElement("tr");
    for (const v of [a.api, num(a.client_per_second, 1), num(a.upstream_per_second, 1),
                     a.client_requests, a.upstream_requests]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.appendChild(td);
    }
    return tr;
  });
  if (rows.length) { body.replaceChildren(...rows); }
  text("uptime", "kipside " + s.kipside_version + ", up " + Math.round(s.uptime_seconds) + " s");
}

async function refresh() {
  const state = $("state");
  try {
    const response = await fetch("/status.json", {cache: "no-store"});
    if (!response.ok) { throw new Error("HTTP " + response.status); }
    const s = await response.json();
    render(s);
    state.textContent = s.ready ? "live" : "live, not ready";
    state.className = s.ready ? "live" : "bad";
    text("updated", "updated " + new Date().toLocaleTimeString());
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
  } catch (err) {
    state.textContent = "no answer from kipside (" + err.message + "); retrying";
    state.className = "bad";
  }
}

async function loop() { await refresh(); setTimeout(loop, 1000); }
loop();
</script>
</body>
</html>
"""
