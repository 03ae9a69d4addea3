"""`kipside dev`: the embedded Tansu broker, kipside in front of it, and a console that helps.

At start it says where clients connect (bootstrap.servers), where the status page is (the admin
endpoint is always on in dev, on loopback) and how to see traces; then, on a terminal, it keeps
one live line of figures at the bottom (proxy.console). Off a terminal it prints plain lines
only. It must never be how kipside runs in front of real brokers: the broker it starts keeps its
data in memory and loses it on exit.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Final

import trio

from kipside.protocol import Address
from kipside.proxy.console import LiveConsole, is_terminal, live_console
from kipside.proxy.devbroker import free_port, start_tansu
from kipside.proxy.server import Server, ServerConfig, StartupError

BROKER_HOST: Final = "127.0.0.1"
ADMIN_DEFAULT: Final = Address("127.0.0.1", 9644)
"""The status page of `kipside dev` unless --admin says otherwise (the port docs/deploy.md uses)."""


def run_dev(config: ServerConfig, broker_port: int = 0) -> int:
    """Start Tansu on broker_port (any free port when 0), serve `config` in front of it until
    SIGINT/SIGTERM, then stop the broker. config.upstreams is replaced by the embedded broker;
    an admin port of 0 becomes a free port, so the status page URL can be printed."""
    proc, port = start_tansu(BROKER_HOST, broker_port, own_process_group=True)
    print(f"kipside: embedded Tansu broker on {BROKER_HOST}:{port} (in-memory)", flush=True)
    admin = config.admin or ADMIN_DEFAULT
    if admin.port == 0:
        admin = Address(admin.host, free_port(admin.host))
    config = replace(config, upstreams=[Address(BROKER_HOST, port)], admin=admin)
    try:
        return _serve(config)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except Exception:
            proc.kill()


def _serve(config: ServerConfig) -> int:
    code = 0
    try:
        if not is_terminal(sys.stdout):
            trio.run(_serve_with, Server(config), None)
        else:
            with live_console(sys.stdout, sys.stderr) as console:
                # The server is built inside, so --trace-console's spans go above the line.
                trio.run(_serve_with, Server(config), console)
    except* StartupError as group:
        for exc in _leaves(group):
            print(f"kipside: error: {exc}", file=sys.stderr)
        code = 2
    return code


def _leaves(group: BaseExceptionGroup[StartupError]) -> list[StartupError]:
    """The errors inside a group, however deeply trio's nurseries nested it."""
    found: list[StartupError] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


async def _serve_with(server: Server, console: LiveConsole | None) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(_serve_then_stop, server, nursery.cancel_scope)
        print(_banner(server), flush=True)
        if console is not None:
            nursery.start_soon(console.run, server.stats)


async def _serve_then_stop(
    server: Server, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
) -> None:
    await server.serve(task_status=task_status)
    scope.cancel()  # the server has shut down: stop the live line too


def _banner(server: Server) -> str:
    config = server.config
    assert config.admin is not None
    host = f"[{config.admin.host}]" if ":" in config.admin.host else config.admin.host
    admin = f"http://{host}:{config.admin.port}"
    return "\n".join(
        (
            f"kipside: give clients bootstrap.servers={server.bootstrap_address}"
            + (
                f" security.protocol=SSL (the CA of {config.tls.cert} in ssl.ca.location)"
                if config.tls is not None
                else ""
            ),
            f"kipside: status page {admin}/ (also /status.json and /metrics)",
            f"kipside: {_traces_hint(config)}",
        )
    )


def _traces_hint(config: ServerConfig) -> str:
    if not config.rules.tracing.enabled:
        return f"traces are off: tracing.enabled is false in {config.rules.source}"
    if config.trace.exporter == "console":
        return "traces: one line per span below (--trace-console)"
    if config.trace.exporter == "otlp":
        return f"traces: exported over OTLP to {config.trace.otlp_endpoint}"
    return (
        "traces are off; see them with --trace-console (one line per span) "
        "or OTEL_EXPORTER_OTLP_ENDPOINT=URL"
    )
