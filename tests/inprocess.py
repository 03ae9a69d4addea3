"""kipside running inside the test process (a trio thread), for tests that need its objects:
spans in an in-memory exporter, its Stats, its rules. Clients and the broker stay real."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from testkit.broker import TANSU_NODE_ID
from testkit.ports import free_port

from kipside.protocol import Address
from kipside.proxy.server import Server, ServerConfig
from kipside.proxy.telemetry.tracing import TraceConfig, Tracer
from kipside.rules import load_rules


@dataclass
class InProcessKipside:
    server: Server
    exporter: InMemorySpanExporter
    thread: threading.Thread
    token: trio.lowlevel.TrioToken

    @property
    def bootstrap(self) -> str:
        assert self.server.bootstrap_address is not None
        return str(self.server.bootstrap_address)

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def stop(self) -> None:
        trio.from_thread.run_sync(self.server.request_shutdown, trio_token=self.token)
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "in-process kipside did not stop"


StartKipside = Callable[[str, str], InProcessKipside]
"""start_kipside_in_process(upstream "host:port", rules YAML text) -> a running kipside."""


@pytest.fixture
def start_kipside_in_process(tmp_path: Path) -> Iterator[StartKipside]:
    started: list[InProcessKipside] = []

    def start(upstream: str, rules_text: str) -> InProcessKipside:
        # From a file, as `kipside serve --rules` reads it (its reloader watches the file).
        rules_file = tmp_path / f"rules-{len(started)}.yaml"
        rules_file.write_text(rules_text)
        rules = load_rules(str(rules_file))
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        host, port = upstream.rsplit(":", 1)
        node_port = free_port()
        config = ServerConfig(
            upstreams=[Address(host, int(port))],
            listen=Address("127.0.0.1", 0),
            node_port_base=node_port - TANSU_NODE_ID,
            rules=rules,
        )
        server = Server(
            config, tracer=Tracer(TraceConfig("none"), rules.tracing, provider=provider)
        )
        ready = threading.Event()
        box: dict[str, object] = {}

        async def main() -> None:
            box["token"] = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve)
                ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # surfaced by the assertion below
                box["error"] = exc
                ready.set()

        thread = threading.Thread(target=run, name="kipside", daemon=True)
        thread.start()
        assert ready.wait(20), "in-process kipside did not start"
        assert "error" not in box, box["error"]
        token = box["token"]
        assert isinstance(token, trio.lowlevel.TrioToken)
        kipside = InProcessKipside(server, exporter, thread, token)
        started.append(kipside)
        return kipside

    yield start
    for kipside in started:
        kipside.stop()
