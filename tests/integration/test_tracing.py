"""Traces and metrics during real client traffic, read back with the SDK's in-memory exporter.

kipside runs in this process (a trio thread) so its spans can go to an InMemorySpanExporter;
the clients are real (confluent-kafka, in processes of their own where they must overlap) and
the broker is the real Tansu, with the marker-window relay from tests/txn_relay.py in front of
it for the transaction-begin hold.

Each test prints the spans it has just checked, as an OTLP user would see them (the SDK's JSON,
resource left out): `pytest -s tests/integration/test_tracing.py` shows the real trace that
docs/observability.md quotes.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from inprocess import InProcessKipside, StartKipside
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanKind
from relaykit.tansu import tansu_behind
from testkit.broker import Broker
from testkit.metrics import Metrics, parse
from txn_relay import MarkerWindowRelay

from kipside.protocol import ApiKey
from kipside.proxy.telemetry.stats import Stats

pytestmark = pytest.mark.integration

DEADLINE = 60.0


def _create(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, partitions, 1) for name, partitions in topics.items()]
    ).values():
        future.result(timeout=15)


def _produce(bootstrap: str, topic: str, partitions: int, index: int, count: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "batch.num.messages": 5,
            "client.id": f"tracing-{index}",
        }
    )
    for i in range(count):
        producer.produce(topic, value=f"{index}:{i}".encode(), partition=i % partitions)
        producer.poll(0)
    assert producer.flush(30) == 0


def _attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def _show(title: str, spans: list[ReadableSpan]) -> None:
    """Print `spans` under `title` (seen with pytest -s)."""
    print(f"\n# {title}\n")
    for span in spans:
        shown = json.loads(span.to_json())
        shown.pop("resource", None)
        print(json.dumps(shown, indent=2))


def _metrics(kipside: InProcessKipside) -> Metrics:
    """What the server's /metrics serves now, parsed."""
    return parse(kipside.server.metrics.prometheus_text().decode())


def _produce_from_processes(bootstrap: str, topic: str, partitions: int) -> None:
    """Six producers at once, each in a process of its own, 300 messages each."""
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_produce, args=(bootstrap, topic, partitions, i, 300))
        for i in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(DEADLINE)
        assert worker.exitcode == 0


def _assert_links(
    upstream: list[ReadableSpan], by_id: dict[int, ReadableSpan], coalesced_batches: int
) -> None:
    """Each upstream span links the client requests (`by_id`) whose batches it carried, one
    link per batch; some carried several; every client request is linked."""
    linked: set[int] = set()
    merged_any = False
    for span in upstream:
        attrs = _attrs(span)
        links = {link.context.span_id for link in span.links}
        assert links <= set(by_id), "an upstream span links a span that is not a client request"
        assert len(span.links) == attrs["kafka.batch_count"]
        assert attrs["kafka.partition_count"] == attrs["kafka.batch_count"]  # one per partition
        assert attrs["messaging.system"] == "kafka"
        merged_any |= len(links) > 1
        linked |= links
    assert merged_any, "no upstream request carried more than one client request"
    assert linked == set(by_id), "every client ProduceRequest is linked from an upstream span"
    counts = [n for s in upstream if isinstance(n := _attrs(s)["kafka.batch_count"], int)]
    assert len(counts) == len(upstream) and sum(counts) == coalesced_batches


def _assert_produce_attributes(requests: list[ReadableSpan], topic: str) -> None:
    """A client ProduceRequest's span: the messaging conventions' attributes and Kafka's."""
    for span in requests:
        attrs = _attrs(span)
        assert attrs["messaging.system"] == "kafka"
        assert attrs["messaging.operation.name"] == "send"
        assert attrs["messaging.destination.name"] == topic
        assert str(attrs["messaging.client.id"]).startswith("tracing-")
        assert attrs["kafka.api_key"] == ApiKey.PRODUCE
        assert isinstance(attrs["kafka.api_version"], int)
        assert "error.type" not in attrs


def test_coalesced_upstream_span_links_every_member(
    start_kipside_in_process: StartKipside, tansu: Broker
) -> None:
    kipside = start_kipside_in_process(
        tansu.bootstrap, "coalescing:\n  lanes: 1\ntracing:\n  api_keys: [Produce]\n"
    )
    topic = f"traced-{time.monotonic_ns()}"
    partitions = 16
    _create(kipside.bootstrap, {topic: partitions})
    _produce_from_processes(kipside.bootstrap, topic, partitions)

    stats = kipside.server.stats
    spans = kipside.spans()
    requests = [
        s for s in spans if s.kind == SpanKind.SERVER and _attrs(s)["kafka.api_name"] == "Produce"
    ]
    upstream = [s for s in spans if s.kind == SpanKind.CLIENT and s.name == "upstream Produce"]
    # One server span per client ProduceRequest, one client span per upstream request.
    assert len(requests) == stats.client_requests[ApiKey.PRODUCE] > 0
    assert len(upstream) == stats.upstream_requests[ApiKey.PRODUCE] > 0
    assert len(upstream) < len(requests)

    by_id = {s.context.span_id: s for s in requests}
    _assert_links(upstream, by_id, stats.coalesced_batches)
    widest = max(upstream, key=lambda s: len(s.links))
    _show("A coalesced upstream ProduceRequest", [widest])
    _show("One of the client requests it carried", [by_id[widest.links[0].context.span_id]])
    _assert_produce_attributes(requests, topic)

    metrics = _metrics(kipside)
    ratio = stats.client_requests[ApiKey.PRODUCE] / stats.upstream_requests[ApiKey.PRODUCE]
    assert metrics.value("kipside_coalescing_ratio") == pytest.approx(ratio)
    produce_latency = metrics.value("kipside_request_latency_seconds_count", api="Produce")
    assert produce_latency == stats.client_requests[ApiKey.PRODUCE]


def _transactions_rules(out: str) -> str:
    """traced-* transactions pre-register `out` and traced-group, their begin held at most 5 s."""
    return (
        "transactions:\n"
        '  - transactional_id: "traced-*"\n'
        f"    outputs: [{{topic: {out}}}]\n"
        "    consumer_group: traced-group\n"
        "    hold_begin: {max_ms: 5000}\n"
    )


def _run_transactions(bootstrap: str, out: str, source: str, transactions: int) -> None:
    """traced-1's transactions, each writing the 4 partitions of `out` and traced-group's
    offset of `source`, all committed."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "traced-1"})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "traced-group"})
    for i in range(transactions):
        producer.begin_transaction()
        for partition in range(4):
            producer.produce(out, value=f"t{i}".encode(), partition=partition)
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, i + 1)], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
    consumer.close()


def _assert_transaction_events(
    events: list[tuple[ReadableSpan, Event]], stats: Stats, transactions: int
) -> None:
    """One pre-registration per transaction, each hold begun and released ready, some calls
    answered locally, all on the transaction registration calls' spans."""
    names = [e.name for _, e in events]
    assert names.count("kipside.txn.preregistered") == transactions
    assert names.count("kipside.txn.hold.begin") == stats.holds > 0
    assert names.count("kipside.txn.hold.release") == stats.holds
    assert names.count("kipside.txn.answered_locally") == stats.txn_local_answers > 0
    for span, event in events:
        assert _attrs(span)["kafka.api_name"] in ("AddPartitionsToTxn", "AddOffsetsToTxn")
        if event.name == "kipside.txn.hold.release":
            attrs = dict(event.attributes or {})
            assert attrs["outcome"] == "ready"
            held_ms = attrs["held_ms"]
            assert isinstance(held_ms, int | float) and held_ms > 0, attrs
        if event.name == "kipside.txn.preregistered":
            attrs = dict(event.attributes or {})
            declared, asked = attrs["declared_partitions"], attrs["client_partitions"]
            assert isinstance(declared, int) and isinstance(asked, int), attrs
            assert declared + asked >= 4
            assert attrs["groups"] == "traced-group"


def test_transaction_spans_show_preregistration_hold_and_local_answers(
    start_kipside_in_process: StartKipside,
) -> None:
    relay = MarkerWindowRelay(window_ms=50)
    with tansu_behind(relay):
        out, source = f"txn-out-{time.monotonic_ns()}", f"txn-in-{time.monotonic_ns()}"
        kipside = start_kipside_in_process(relay.bootstrap, _transactions_rules(out))
        _create(kipside.bootstrap, {out: 4, source: 1})
        transactions = 8
        _run_transactions(kipside.bootstrap, out, source, transactions)

        stats = kipside.server.stats
        spans = kipside.spans()
        events = [(s, e) for s in spans if s.kind == SpanKind.SERVER for e in s.events]
        _assert_transaction_events(events, stats, transactions)
        _show(
            "A transaction's first registration, held",
            [s for s, e in events if e.name == "kipside.txn.hold.release"][-1:],
        )
        _show(
            "A covered call answered locally",
            [s for s, e in events if e.name == "kipside.txn.answered_locally"][-1:],
        )
        # Relay's view: the hold's retries were rejected in the window, none reached a client.
        assert relay.counts().rejected_add_partitions + relay.counts().rejected_add_offsets > 0
        assert _metrics(kipside).value("kipside_holds_total") == stats.holds
