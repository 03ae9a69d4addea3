"""The admin endpoint's routes: health, readiness, metrics, rules, reload and the status page.

`AdminApp.handle` maps (method, target, body) to a Reply: 404 for an unknown path, 405 for a
known path with another method, 500 (logged) for a handler that fails. The status page is the
static files under static/, read once through importlib.resources; its figures come from
GET /status.json.

It must never block, slow or take down the Kafka traffic it reports on: it only reads the
server's counters, and rule reloads go through proxy.operations.reload, which validates a file
in full before anything changes. It knows the server only as `AdminSource`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib.resources import files
from typing import Final, Protocol

import trio

from kipside.protocol import Address, ApiKey, api_name
from kipside.proxy.operations.admin.httpd import REQUEST_DEADLINE_SECONDS, Reply, serve_http
from kipside.proxy.operations.admin.rates import RATE_SAMPLE_SECONDS, RateWindow
from kipside.proxy.operations.reload import RuleReloader
from kipside.proxy.telemetry.metric_readers import PROMETHEUS_CONTENT_TYPE
from kipside.proxy.telemetry.metrics import KIPSIDE_VERSION, Metrics
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet

log = logging.getLogger("kipside.admin")

READY_PROBE_SECONDS: Final = 2.0
READY_REMEMBER_SECONDS: Final = 10.0
"""A broker that accepted a connection this recently still counts as reachable."""

JSON: Final = "application/json"
# The page, its style and its script come from this endpoint only: no inline code, nothing
# fetched from anywhere else, so it works on an air-gapped host.
PAGE_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC_FILES: Final = {
    b"/": ("status.html", "text/html; charset=utf-8"),
    b"/static/status.css": ("status.css", "text/css; charset=utf-8"),
    b"/static/status.js": ("status.js", "text/javascript; charset=utf-8"),
}
"""Path -> (file under static/, content type)."""


def _json_reply(status: int, value: object) -> Reply:
    return Reply(status, (json.dumps(value, indent=2) + "\n").encode(), JSON)


class AdminConfig(Protocol):
    """What the endpoint reads of the server's configuration: the brokers /readyz may probe."""

    @property
    def upstreams(self) -> Sequence[Address]: ...


class AdminSource(Protocol):
    """What the admin endpoint reads of the server (proxy.server.Server)."""

    @property
    def stats(self) -> Stats: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def rules(self) -> RuleSet: ...
    @property
    def ready(self) -> trio.Event: ...
    @property
    def config(self) -> AdminConfig: ...
    @property
    def reloader(self) -> RuleReloader: ...


def _static_replies() -> dict[bytes, Reply]:
    folder = files("kipside.proxy.operations.admin").joinpath("static")
    headers = (("content-security-policy", PAGE_POLICY),)
    return {
        path: Reply(200, folder.joinpath(name).read_bytes(), content_type, headers)
        for path, (name, content_type) in STATIC_FILES.items()
    }


def _ratio(client: float, upstream: float) -> float | None:
    return round(client / upstream, 2) if upstream > 0 else None


Handler = Callable[[bytes], Awaitable[Reply]]


def _constant(reply: Reply) -> Handler:
    async def answer(body: bytes) -> Reply:
        return reply

    return answer


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
        # Read once: a missing file fails here, at start, not on a request.
        self.routes: dict[bytes, tuple[tuple[bytes, ...], Handler]] = {
            path: (get, _constant(reply)) for path, reply in _static_replies().items()
        }
        self.routes |= {
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
        return Reply(200, self.server.metrics.prometheus_text(), PROMETHEUS_CONTENT_TYPE)

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

    def status(self) -> dict[str, object]:
        """The live figures of the status page."""
        server = self.server
        stats = server.stats
        rules = server.rules
        reloader = server.reloader
        now = trio.current_time()
        rates = self.rates.rates(now, stats)
        window, client_rates, upstream_rates = rates if rates is not None else (None, {}, {})
        produce_client = stats.client_requests[ApiKey.PRODUCE]
        produce_upstream = stats.upstream_requests[ApiKey.PRODUCE]
        return {
            "kipside_version": KIPSIDE_VERSION,
            "uptime_seconds": round(now - self.started_at, 1),
            "ready": server.ready.is_set(),
            "connections": {
                "client": stats.client_connections,
                "upstream": stats.upstream_connections,
            },
            "rate_window_seconds": None if window is None else round(window, 1),
            "apis": _api_figures(stats, client_rates, upstream_rates),
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


def _api_figures(
    stats: Stats, client_rates: dict[int, float], upstream_rates: dict[int, float]
) -> list[dict[str, object]]:
    def rate(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return [
        {
            "api": api_name(key),
            "client_requests": stats.client_requests[key],
            "upstream_requests": stats.upstream_requests[key],
            "client_per_second": rate(client_rates.get(key)),
            "upstream_per_second": rate(upstream_rates.get(key)),
        }
        for key in sorted(set(stats.client_requests) | set(stats.upstream_requests))
    ]


async def serve_admin(listener: trio.SocketListener, app: AdminApp) -> None:
    """Serve the admin endpoint (and sample request rates) until cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.sample_rates)
        await serve_http(listener, app.handle, app.request_deadline)
