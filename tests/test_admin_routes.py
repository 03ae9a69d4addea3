"""Tests for proxy.operations.admin (the HTTP admin endpoint): what each path answers
(health, readiness, /metrics, /rules, the status page and its figures), 404 and 405, and the
command line's --admin address.

The endpoint and its clients are tests/admin_kit.py's. Every test runs under an absolute
trio.fail_after.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
import trio
import trio.testing
from admin_kit import CLIENTS, TIMEOUT, Admin, fetch, h11_request
from admin_kit import admin as admin
from testkit.metrics import parse

from kipside.protocol import Address
from kipside.protocol.apis import ApiKey
from kipside.proxy.cli import _admin_address
from kipside.proxy.operations.admin import RateWindow
from kipside.proxy.telemetry.stats import Stats

# --------------------------------------------------------------------------- each path


async def _health_answers(client: str, admin: Admin) -> None:
    health = await fetch(client, admin, "GET", "/healthz")
    assert (health.status, health.body) == (200, b"ok\n")
    assert health.headers["connection"] == "close"
    head = await fetch(client, admin, "HEAD", "/healthz")
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == "3"


async def _ready_names_the_broker_and_rules(client: str, admin: Admin) -> None:
    ready = await fetch(client, admin, "GET", "/readyz")
    assert ready.status == 200, ready.body
    assert ready.body.startswith(b"ready: broker 127.0.0.1:")
    assert admin.server.rules.version.encode() in ready.body


async def _metrics_are_prometheus_text(client: str, admin: Admin) -> None:
    rules = admin.server.rules
    metrics = await fetch(client, admin, "GET", "/metrics")
    assert metrics.status == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    scraped = parse(metrics.body.decode())
    assert scraped.value("kipside_rules_info", version=rules.version, source=rules.source) == 1
    assert scraped.value("kipside_rule_reloads_total") == 0
    assert scraped.value("kipside_rule_reload_errors_total") == 0
    assert scraped.value("kipside_client_connections") == 0
    assert scraped.value("kipside_build_info", version=version("kipside")) == 1


async def _rules_and_status_are_json(client: str, admin: Admin) -> None:
    rules = admin.server.rules
    got = await fetch(client, admin, "GET", "/rules")
    assert got.status == 200 and got.headers["content-type"] == "application/json"
    assert got.json() == rules.describe()

    status = await fetch(client, admin, "GET", "/status.json")
    figures = status.json()
    assert isinstance(figures, dict)
    assert figures["rules"]["version"] == rules.version
    assert figures["connections"] == {"client": 0, "upstream": 0}
    assert figures["kipside_version"] == version("kipside")


async def _status_page_is_self_contained(client: str, admin: Admin) -> None:
    page = await fetch(client, admin, "GET", "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "connect-src 'self'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    html = page.body.decode()
    assert 'id="rules-version"' in html and 'id="client-connections"' in html
    assert '<script src="/static/status.js">' in html
    assert '<link rel="stylesheet" href="/static/status.css">' in html
    script = await fetch(client, admin, "GET", "/static/status.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert 'fetch("/status.json"' in script.body.decode()
    style = await fetch(client, admin, "GET", "/static/status.css")
    assert style.headers["content-type"].startswith("text/css")
    # Self-contained: nothing is loaded from anywhere else, and no inline code.
    for text in (html, style.body.decode()):
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
        assert "@import" not in text and "url(" not in text
    assert "<style" not in html and "<script>" not in html
    assert not re.search(r"\son[a-z]+=", html)  # no inline event handlers


async def _unchanged_reload_says_so(client: str, admin: Admin) -> None:
    rules = admin.server.rules
    unchanged = await fetch(client, admin, "POST", "/rules/reload")
    assert unchanged.status == 200
    assert unchanged.json() == {
        "ok": True,
        "outcome": "unchanged",
        "version": rules.version,
        "previous_version": rules.version,
        "source": rules.source,
        "problems": [],
    }


@pytest.mark.parametrize("client", CLIENTS)
async def test_each_path_answers(admin: Admin, client: str, tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        await _health_answers(client, admin)
        await _ready_names_the_broker_and_rules(client, admin)
        await _metrics_are_prometheus_text(client, admin)
        await _rules_and_status_are_json(client, admin)
        await _status_page_is_self_contained(client, admin)
        await _unchanged_reload_says_so(client, admin)


@pytest.mark.parametrize("client", CLIENTS)
async def test_unknown_path_404_and_wrong_method_405(admin: Admin, client: str) -> None:
    with trio.fail_after(TIMEOUT):
        missing = await fetch(client, admin, "GET", "/nope")
        assert missing.status == 404
        assert b"/healthz" in missing.body  # says what does exist
        query = await fetch(client, admin, "GET", "/healthz?verbose=1")
        assert query.status == 200
        post = await fetch(client, admin, "POST", "/healthz")
        assert (post.status, post.headers["allow"]) == (405, "GET, HEAD")
        get_reload = await fetch(client, admin, "GET", "/rules/reload")
        assert (get_reload.status, get_reload.headers["allow"]) == (405, "POST")
        delete = await fetch(client, admin, "DELETE", "/rules")
        assert delete.status == 405
    assert admin.server.reloader.rule_reloads == 0


# --------------------------------------------------------------------------- readiness


async def test_readyz_before_discovery_is_503(admin: Admin) -> None:
    admin.server.ready = trio.Event()
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(admin.port, "GET", "/readyz")
    assert answer.status == 503 and b"discovering" in answer.body


async def test_readyz_is_503_when_no_upstream_answers(admin: Admin) -> None:
    port = admin.broker.socket.getsockname()[1]
    await admin.broker.aclose()
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(admin.port, "GET", "/readyz")
        assert answer.status == 503
        assert f"127.0.0.1:{port}".encode() in answer.body  # names what it tried
        # An open broker connection is proof enough, whatever the bootstrap address does.
        admin.server.stats.upstream_connections = 2
        answer = await h11_request(admin.port, "GET", "/readyz")
        assert answer.status == 200 and b"2 broker connections open" in answer.body


# --------------------------------------------------------------------------- status figures


async def test_status_figures(admin: Admin) -> None:
    stats = admin.server.stats
    stats.client_connections = 7
    stats.upstream_connections = 2
    stats.client_requests[ApiKey.PRODUCE] = 90
    stats.upstream_requests[ApiKey.PRODUCE] = 30
    stats.holds = 4
    status = admin.app.status()
    assert status["connections"] == {"client": 7, "upstream": 2}
    produce = status["produce"]
    assert isinstance(produce, dict) and produce["coalescing_ratio"] == 3.0
    assert status["holds"] == {"holds": 4, "hold_retries": 0}


def test_rate_window() -> None:
    stats = Stats()
    window = RateWindow(samples=3)
    assert window.rates(0.0, stats) is None
    stats.client_requests[ApiKey.PRODUCE] = 10
    window.sample(0.0, stats)
    stats.client_requests[ApiKey.PRODUCE] = 30
    stats.upstream_requests[ApiKey.PRODUCE] = 5
    window.sample(1.0, stats)
    stats.client_requests[ApiKey.PRODUCE] = 50
    rates = window.rates(2.0, stats)
    assert rates is not None
    seconds, client, upstream = rates
    assert (seconds, client[ApiKey.PRODUCE], upstream[ApiKey.PRODUCE]) == (2.0, 20.0, 2.5)
    for t in (2.0, 3.0, 4.0):  # the oldest samples fall out of the window
        window.sample(t, stats)
    rates = window.rates(5.0, stats)
    assert rates is not None and rates[1][ApiKey.PRODUCE] == 0.0


# --------------------------------------------------------------------------- command line


def test_admin_bare_port_binds_loopback() -> None:
    assert _admin_address("9644") == Address("127.0.0.1", 9644)
    assert _admin_address("0.0.0.0:9644") == Address("0.0.0.0", 9644)
    assert _admin_address("[::1]:9644") == Address("::1", 9644)
