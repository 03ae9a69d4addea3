"""Tests for proxy.operations.admin (the HTTP admin endpoint) and
proxy.operations.reload (rule hot reload): POST /rules/reload, applying new rules to every
reader of them, the triggers (file change, SIGHUP), and `kipside rules check`.

The endpoint and its clients are tests/admin_kit.py's. Tests with no socket run on trio's
MockClock with autojump (the file watcher's polls in virtual time), so poll intervals cost no
real time. Every test runs under an absolute trio.fail_after.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from admin_kit import (
    CLIENTS,
    REQUEST_DEADLINE,
    RULES_INVALID,
    RULES_V1,
    RULES_V2,
    TIMEOUT,
    TXN_RULES,
    Admin,
    fetch,
    h11_request,
    make_server,
)
from admin_kit import admin as admin
from testkit.metrics import parse

from kipside.proxy.cli import main
from kipside.proxy.core.identity import ANONYMOUS
from kipside.proxy.operations.admin import AdminApp, serve_admin
from kipside.proxy.operations.reload import POLL_SECONDS, apply_rules
from kipside.proxy.server import Server
from kipside.proxy.stages.coalescing import Coalescer
from kipside.proxy.stages.context import FeatureContext
from kipside.rules import RuleSet, load_rules, parse_rules

# --------------------------------------------------------------------------- reload over HTTP


@pytest.mark.parametrize("client", CLIENTS)
async def test_post_reload_applies_a_valid_file(admin: Admin, client: str) -> None:
    old = admin.server.rules
    admin.rules_path.write_text(RULES_V2)
    with trio.fail_after(TIMEOUT):
        answer = await fetch(client, admin, "POST", "/rules/reload")
        assert answer.status == 200
        result = answer.json()
        assert isinstance(result, dict)
        assert result["outcome"] == "applied" and result["previous_version"] == old.version
        new_version = result["version"]
        assert new_version != old.version
        got = await fetch(client, admin, "GET", "/rules")
        rules = got.json()
        assert isinstance(rules, dict)
        assert rules["version"] == new_version and rules["coalescing"]["linger_ms"] == 7.0
        metrics = parse((await fetch(client, admin, "GET", "/metrics")).body.decode())
    assert metrics.value("kipside_rule_reloads_total") == 1
    assert metrics.value("kipside_rules_info", version=new_version) == 1
    assert len(metrics.matching("kipside_rules_info")) == 1  # the old version is gone
    assert admin.server.rules.coalescing.linger_ms == 7.0


@pytest.mark.parametrize("client", CLIENTS)
async def test_post_reload_rejects_an_invalid_file_and_keeps_the_rules(
    admin: Admin, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = admin.server.rules
    admin.rules_path.write_text(RULES_INVALID)
    path = str(admin.rules_path)
    with trio.fail_after(TIMEOUT):
        answer = await fetch(client, admin, "POST", "/rules/reload")
        assert answer.status == 422
        result = answer.json()
        assert isinstance(result, dict)
        assert result["ok"] is False and result["version"] == old.version
        assert result["problems"] == [
            f"{path}:2: coalescing.lanes: expected an integer between 1 and 64, got 0 (an integer)",
            f"{path}:3: coalescing.bogus: unknown key 'bogus'; allowed keys here are: enabled, "
            "lanes, linger_ms, max_request_bytes, rules",
        ]
        still = (await fetch(client, admin, "GET", "/rules")).json()
        assert isinstance(still, dict) and still["version"] == old.version
        metrics = parse((await fetch(client, admin, "GET", "/metrics")).body.decode())
        status = (await fetch(client, admin, "GET", "/status.json")).json()
    assert admin.server.rules is old
    assert metrics.value("kipside_rule_reload_errors_total") == 1
    assert metrics.value("kipside_rule_reloads_total") == 0
    assert metrics.value("kipside_rules_info", version=old.version) == 1
    assert (
        isinstance(status, dict) and f"{path}:2: coalescing.lanes" in status["rules"]["last_error"]
    )
    assert f"{path}:2: coalescing.lanes" in caplog.text
    assert f"version {old.version} stays in force" in caplog.text


async def test_post_reload_without_a_rule_file_is_409(nursery: trio.Nursery) -> None:
    server = make_server(None, 9)
    server.ready.set()
    app = AdminApp(server, request_deadline=REQUEST_DEADLINE)
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(serve_admin, listener, app)
    with trio.fail_after(TIMEOUT):
        answer = await h11_request(listener.socket.getsockname()[1], "POST", "/rules/reload")
    assert answer.status == 409 and b"--rules FILE" in answer.body
    assert server.reloader.rule_reload_errors == 0


# --------------------------------------------------------------------------- applying rules


async def test_apply_reaches_every_reader_of_the_rules(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V1)
    server = make_server(path, 9)
    coalescer = Coalescer(
        FeatureContext(
            lambda node_id, principal: SimpleNamespace(lanes=2, node_id=node_id),  # type: ignore[arg-type,return-value]
            server.default_node,
            lambda: server.rules,
            server.stats,
            nursery,
        ),
        server.nodes,
    )
    existing_lanes = coalescer.lanes(111, ANONYMOUS)
    assert server.versions.lower_transaction_version is False

    path.write_text(
        "coalescing:\n  lanes: 5\n  linger_ms: 7\n  rules:\n"
        '    - {topic: "audit.*", coalesce: false}\n' + TXN_RULES
    )
    with trio.fail_after(TIMEOUT), caplog.at_level(logging.INFO):
        result = await server.reloader.reload("test")
    assert result.outcome == "applied"
    new = server.rules
    assert new.coalescing.lanes == 5 and new.transactions
    assert coalescer.rules is new.coalescing
    assert existing_lanes.rules is new.coalescing  # linger/max bytes of running lanes follow
    assert not coalescer.rules.applies("audit.x", "c")
    assert server.versions.lower_transaction_version is True
    assert "coalescing.lanes changed from 2 to 5" in caplog.text
    assert "until kipside restarts" in caplog.text

    path.write_text(RULES_V1)
    with trio.fail_after(TIMEOUT):
        await server.reloader.reload("test")
    assert server.versions.lower_transaction_version is False


async def test_apply_in_one_to_one_mode_never_lowers_transaction_version() -> None:
    server = make_server(None, 9)
    server.config.share_connections = False
    apply_rules(server, parse_rules(TXN_RULES, "<test>"))
    assert server.versions.lower_transaction_version is False


# --------------------------------------------------------------------------- triggers


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V1)
    server = make_server(path, 9)
    yield server, path


@pytest.fixture
def inline_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reloader's stat() and rule parsing run inline instead of in a worker thread, so
    under the autojump clock no virtual time passes while a thread works."""

    async def run_inline(fn: Callable[..., object], *args: object, **_: object) -> object:
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_inline)


POLL = POLL_SECONDS
SETTLED = 2 * POLL + 0.01
"""A change is applied once it has held still for one poll, so within two polls."""


async def test_file_change_reloads(
    watched: tuple[Server, Path],
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
    inline_file_reads: None,
) -> None:
    caplog.set_level(logging.INFO)
    server, path = watched
    reloader = server.reloader
    old = server.rules
    await nursery.start(reloader.run)
    await trio.sleep(5 * POLL)  # looks at an unchanged file neither apply nor count
    assert (reloader.rule_reloads, server.rules) == (0, old)

    path.write_text(RULES_V2)
    await trio.sleep(SETTLED)
    assert server.rules.version != old.version
    assert reloader.rule_reloads == 1 and server.rules.coalescing.linger_ms == 7.0
    assert "rules reloaded (file change)" in caplog.text

    path.write_text(RULES_INVALID)
    await trio.sleep(SETTLED)
    assert reloader.rule_reload_errors == 1
    await trio.sleep(5 * POLL)  # an unchanged broken file is reported once, not every poll
    assert reloader.rule_reload_errors == 1
    assert server.rules.coalescing.linger_ms == 7.0
    assert f"{path}:2: coalescing.lanes" in caplog.text

    path.unlink()
    await trio.sleep(SETTLED)
    assert caplog.text.count("is gone") == 1 and server.rules.coalescing.linger_ms == 7.0
    await trio.sleep(5 * POLL)
    assert caplog.text.count("is gone") == 1  # logged once
    path.write_text(RULES_V1)
    await trio.sleep(SETTLED)
    assert server.rules.version == old.version


async def test_a_post_does_not_make_the_watcher_read_the_file_again(
    watched: tuple[Server, Path],
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    inline_file_reads: None,
) -> None:
    server, path = watched
    reloader = server.reloader
    await nursery.start(reloader.run)
    path.write_text(RULES_INVALID)
    with trio.fail_after(TIMEOUT):
        result = await reloader.reload("POST /rules/reload")
    assert result.outcome == "rejected"
    await trio.sleep(5 * POLL)
    assert reloader.rule_reload_errors == 1


async def test_sighup_reloads(watched: tuple[Server, Path], nursery: trio.Nursery) -> None:
    server, path = watched
    reloader = server.reloader
    reloader.poll_seconds = 3600  # only the signal may trigger this reload
    await nursery.start(reloader.run)
    path.write_text(RULES_V2)
    os.kill(os.getpid(), signal.SIGHUP)
    with trio.fail_after(TIMEOUT):
        while reloader.rule_reloads == 0:  # noqa: ASYNC110 (the reloader has no event to wait on)
            await trio.sleep(0.01)
    assert server.rules.coalescing.linger_ms == 7.0


def test_rules_check_prints_the_effective_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_V2)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    described = json.loads(out)
    assert list(described)[:2] == ["source", "version"]
    assert described == load_rules(path).describe()
    assert f"{path}: OK (version {described['version']})" in err

    path.write_text(RULES_INVALID)
    assert main(["rules", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path}:2: coalescing.lanes" in err and f"{path}:3: coalescing.bogus" in err


async def test_a_loader_bug_is_a_refused_reload(
    watched: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = watched
    old = server.rules

    def broken(path: str) -> RuleSet:
        raise RuntimeError("bug")

    monkeypatch.setattr("kipside.proxy.operations.reload.load_rules", broken)
    with trio.fail_after(TIMEOUT):
        result = await server.reloader.reload("test")
    assert result.outcome == "rejected" and "RuntimeError('bug')" in result.problems[0]
    assert server.rules is old and server.reloader.rule_reload_errors == 1
