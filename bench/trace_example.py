"""Capture a real trace of a coalesced ProduceRequest and of a held transaction begin.

Runs kipside (in this process, so spans can be printed with the SDK's console exporter format)
in front of the marker-window relay from tests/txn_relay.py and a fresh Tansu, drives real
confluent-kafka clients, and prints: one upstream Produce span with the client request spans it
links, and one AddPartitionsToTxn/AddOffsetsToTxn span carrying hold and pre-registration events.
docs/observability.md shows its output. Loopback only.

    .venv/bin/python bench/trace_example.py
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import trio
from _harness import HOST
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from testkit.broker import start_tansu
from testkit.ports import free_port
from txn_relay import MarkerWindowRelay

from kipside.protocol import Address
from kipside.proxy.server import Server, ServerConfig
from kipside.proxy.telemetry.tracing import TraceConfig, Tracer
from kipside.rules import parse_rules

RULES = """\
coalescing:
  lanes: 1
transactions:
  - transactional_id: "enricher-*"
    outputs: [{topic: enriched}]
    consumer_group: enricher
    hold_begin: {max_ms: 5000}
"""


def produce(bootstrap: str, index: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "client.id": f"web-worker-{index}"}
    )
    for i in range(200):
        producer.produce("orders", value=b"x" * 100, partition=(i + index) % 8)
        producer.poll(0)
    producer.flush(30)


def main() -> None:
    relay = MarkerWindowRelay(window_ms=50).start()
    broker = start_tansu(advertised_port=relay.port)
    relay.upstream = (HOST, broker.port)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rules = parse_rules(RULES, "example.yaml")
    config = ServerConfig(
        upstreams=[Address(HOST, relay.port)],
        listen=Address(HOST, 0),
        node_port_base=free_port() - 111,
        rules=rules,
    )
    server = Server(config, tracer=Tracer(TraceConfig("none"), rules.tracing, provider=provider))
    token: list[trio.lowlevel.TrioToken] = []
    ready = threading.Event()

    async def run() -> None:
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            ready.set()

    thread = threading.Thread(target=trio.run, args=(run,), daemon=True)
    thread.start()
    ready.wait(20)
    bootstrap = str(server.bootstrap_address)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics(
            [NewTopic("orders", 8, 1), NewTopic("enriched", 4, 1), NewTopic("raw", 1, 1)]
        ).values():
            f.result(15)
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=produce, args=(bootstrap, i)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "enricher-1"})
        producer.init_transactions(30)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "enricher"})
        for i in range(3):
            producer.begin_transaction()
            for p in range(4):
                producer.produce("enriched", value=b"e", partition=p)
            producer.send_offsets_to_transaction(
                [TopicPartition("raw", 0, i + 1)], consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
        consumer.close()
        time.sleep(0.2)
    finally:
        trio.from_thread.run_sync(server.request_shutdown, trio_token=token[0])
        thread.join(15)
        relay.close()
        broker.close()
    spans = exporter.get_finished_spans()
    show(spans)


def show(spans: tuple[ReadableSpan, ...]) -> None:
    by_id = {s.context.span_id: s for s in spans}
    upstream = [s for s in spans if s.kind == SpanKind.CLIENT and s.name == "upstream Produce"]
    best = max(upstream, key=lambda s: len({link.context.span_id for link in s.links}))
    print("# A coalesced upstream ProduceRequest and the client requests it carried\n")
    print(best.to_json(indent=2))
    for span_id in dict.fromkeys(link.context.span_id for link in best.links):
        print(by_id[span_id].to_json(indent=2))
    held = [s for s in spans if any(e.name == "kipside.txn.hold.begin" for e in s.events)]
    print("\n# A transaction's first registration, held through CONCURRENT_TRANSACTIONS\n")
    print(held[-1].to_json(indent=2) if held else "(no hold happened in this run)")
    local = [s for s in spans if any(e.name == "kipside.txn.answered_locally" for e in s.events)]
    print("\n# A covered call answered locally\n")
    print(local[-1].to_json(indent=2) if local else "(none in this run)")


if __name__ == "__main__":
    main()
