"""Multi-batch produce end to end: real clients -> kipside -> CountingRelay -> Tansu.

The coalescing itself, with nothing failing. The stack (coalesce_kit) has the relay count,
independently of kipside, every request and connection kipside makes upstream and every batch
it forwards; the clients' side is captured on loopback (coalesce_capture), so what each client
sent is known byte for byte without trusting kipside's proxy. Producers run in processes of
their own (coalesce_producers).

- test_many_producers_coalesce_without_loss_or_change: 18 producers (16 confluent-kafka, one
  kafka-python, one aiokafka; idempotent, acks=all/1/0, every codec) on shared partitions:
  everything in the log exactly once and in order, batches byte-identical (CRCs) at the broker,
  fewer upstream than client ProduceRequests, upstream connections within the lanes.

The other coalescing tests: test_coalesce_upstream_cut.py (the relay cuts every lane under
load), test_coalesce_lane_order.py (a cut lane lets no later idempotent batch overtake),
test_coalesce_acks0.py (acks=0 producers against Tansu as it is).

Run: .venv/bin/pytest tests/integration/test_coalesce*.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import create_topics, unique_name
from relays import BatchSeen, RelayCounts, RelayedConnection
from testkit.metrics import Metrics

from kipside.protocol.apis import ApiKey
from kipside.protocol.records import Compression

from . import coalesce_kit as kit
from . import coalesce_producers as producers
from .coalesce_capture import ClientCapture, ClientRequest

pytestmark = pytest.mark.integration

TOPICS = 3
MESSAGES = 240


stack = kit.stack_fixture("stack", kafka_acks0=True)


def _fleet_specs(targets: list[tuple[str, int]]) -> list[producers.ProducerSpec]:
    # (acks, idempotent) by turn: idempotent, acks=all, acks=1, acks=0
    modes = [(-1, True), (-1, False), (1, False), (0, False)]
    # name, library, acks, idempotent, compression, turn of the targets, pause every N messages
    rows = [
        (f"ck{i:02d}", "confluent-kafka", *modes[i % 4], kit.CODECS[i % len(kit.CODECS)], i, 8)
        for i in range(16)
    ]
    rows += [
        ("kp00", "kafka-python", -1, True, "snappy", 5, 4),
        ("aio00", "aiokafka", 1, False, "zstd", 7, 4),
    ]
    return [
        producers.ProducerSpec(
            name,
            lib,
            acks,
            idem,
            codec,
            {},
            producers.rotated(targets, turn),
            MESSAGES,
            every,
            0.002,
        )
        for name, lib, acks, idem, codec, turn, every in rows
    ]


@dataclass
class FleetRun:
    """One produce phase, watched from both sides: the clients' (captured on lo) and the
    broker's (the relay), with kipside's own metrics before and after."""

    outcomes: list[producers.Outcome]
    before: RelayCounts
    after: RelayCounts
    connections: list[RelayedConnection]  # upstream, before the checker's consumer dials
    metrics_before: Metrics
    metrics_after: Metrics
    produce_started: float
    client_requests: list[ClientRequest]
    capture: ClientCapture

    def produce_requests(self, side: str) -> float:
        """ProduceRequests kipside counted on one side (client, upstream) during the run."""
        name = f"kipside_{side}_requests_total"
        after = self.metrics_after.value(name, api="Produce")
        return after - self.metrics_before.value(name, 0.0, api="Produce")


def _run_fleet_captured(
    stack: kit.Stack, specs: list[producers.ProducerSpec], tmp_path: Path
) -> FleetRun:
    """Start the producers, let them all go at once from an idle upstream, wait until they end."""
    capture = ClientCapture(stack.kipside.ports)
    capture.start()
    fleet = producers.ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    try:
        fleet.start()  # every producer has its metadata (and producer id, if idempotent)
        kit.wait_for_idle_upstream(stack)
        before = stack.relay.counts()
        metrics_before = stack.metrics()
        stack.relay.reset_peak()
        produce_started = time.monotonic()
        fleet.go.set()
        outcomes = fleet.join(producers.PRODUCE_TIMEOUT + 30)
    finally:
        fleet.kill()
    after = stack.relay.counts()
    connections = stack.relay.connections()  # before the checker's consumer adds its own
    metrics_after = stack.metrics()
    client_requests = capture.stop(tmp_path / "clients.pcap")
    return FleetRun(
        outcomes,
        before,
        after,
        connections,
        metrics_before,
        metrics_after,
        produce_started,
        client_requests,
        capture,
    )


def _assert_batches_unchanged(
    client_batches: list[BatchSeen], stack: kit.Stack, records_sent: int
) -> list[BatchSeen]:
    """What the clients sent (captured on lo) is, CRC for CRC and partition for partition, what
    kipside forwarded to the broker (seen by the relay); returns the batches forwarded."""
    upstream_batches = stack.relay.batches()
    assert all(b.crc_valid for b in client_batches)
    assert all(b.crc_valid for b in upstream_batches), "kipside changed a batch's bytes"
    assert stack.relay.problems() == []
    client_crcs = Counter((b.topic, b.partition, b.crc) for b in client_batches)
    upstream_crcs = Counter((b.topic, b.partition, b.crc) for b in upstream_batches)
    assert client_crcs == upstream_crcs, (
        f"only sent by clients: {list((client_crcs - upstream_crcs).items())[:5]}; "
        f"only upstream: {list((upstream_crcs - client_crcs).items())[:5]}"
    )
    assert sum(b.records_count for b in client_batches) == records_sent
    codecs_seen = {Compression(b.compression).name.lower() for b in upstream_batches}
    assert codecs_seen == set(kit.CODECS), codecs_seen
    assert {b.acks for b in upstream_batches} == {-1, 0, 1}
    return upstream_batches


def _assert_fewer_requests_upstream(
    run: FleetRun, client_produce: list[ClientRequest], upstream_batches: list[BatchSeen]
) -> int:
    """Fewer requests upstream than clients sent, by kipside's count and by independent ones
    (the capture for the clients' side, the relay for the broker's side); returns how many
    ProduceRequests the relay saw."""
    client_metric = run.produce_requests("client")
    upstream_metric = run.produce_requests("upstream")
    relay_upstream = run.after.requests[ApiKey.PRODUCE] - run.before.requests[ApiKey.PRODUCE]
    assert len(client_produce) == client_metric, (len(client_produce), client_metric)
    assert relay_upstream == upstream_metric, (relay_upstream, upstream_metric)
    assert relay_upstream < len(client_produce), (relay_upstream, len(client_produce))
    assert upstream_metric < client_metric
    coalesced = run.metrics_after.value("kipside_coalesced_batches_total")
    assert coalesced == len(upstream_batches), (coalesced, len(upstream_batches))
    return relay_upstream


def _assert_only_lanes_upstream(run: FleetRun) -> list[RelayedConnection]:
    """While the 18 producers ran, only LANES per broker node were open upstream: the shared
    lanes, which carry every ProduceRequest and the short APIs (ApiVersions, Metadata,
    InitProducerId, GetTelemetrySubscriptions). Producers use no blocking API (Fetch, group
    APIs), so none gets a connection of its own. Before that, the relay carried exactly two
    others, both closed before the producers started: kipside's start-up discovery (one
    Metadata request) and the connection of the admin client that created the topics
    (CreateTopics is not a short API, so it went on that client's own connection). The
    checker's consumer, afterwards, gets one for its Fetches: not counted here. Returns the
    connections that carried ProduceRequests."""
    before, after, connections = run.before, run.after, run.connections
    opened_during = after.accepted - before.accepted
    assert before.open + opened_during <= kit.LANES * kit.BROKERS, (before, after)
    assert after.peak_open <= kit.LANES * kit.BROKERS, after
    assert run.metrics_after.value("kipside_upstream_connections") <= kit.LANES * kit.BROKERS
    produce_connections = [c for c in connections if c.requests[ApiKey.PRODUCE]]
    assert 1 <= len(produce_connections) <= kit.LANES * kit.BROKERS, produce_connections
    others = sorted(
        (sorted(c.requests.items()), c.closed_at is not None and c.closed_at < run.produce_started)
        for c in connections
        if not c.requests[ApiKey.PRODUCE]
    )
    assert others == [([(ApiKey.METADATA, 1)], True), ([(ApiKey.CREATE_TOPICS, 1)], True)], others
    return produce_connections


def test_many_producers_coalesce_without_loss_or_change(
    stack: kit.Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topics = [unique_name(f"co{t}", request) for t in range(TOPICS)]
    create_topics(stack.kipside.bootstrap, topics, kit.PARTITIONS)
    targets = producers.targets_of(topics, kit.PARTITIONS)
    specs = _fleet_specs(targets)
    assert len(specs) >= 18
    assert {s.compression for s in specs} == set(kit.CODECS)

    run = _run_fleet_captured(stack, specs, tmp_path)

    # Every producer finished and saw every message delivered.
    for o in run.outcomes:
        o.assert_all_delivered()

    # Every message (acks=0 ones too: nothing failed here) is in the log exactly once, where
    # its producer sent it, and nothing else is.
    sent = {(o.spec.name, seq): (t, p) for o in run.outcomes for seq, t, p in o.delivered}
    records = kit.assert_logged_once(stack.kipside.bootstrap, targets, set(sent), specs)
    for r in records:
        assert sent[(r.producer, r.seq)] == (r.topic, r.partition), r

    client_produce = [r for r in run.client_requests if r.api_key == ApiKey.PRODUCE]
    client_batches = [b for r in client_produce for b in r.batches]
    upstream_batches = _assert_batches_unchanged(client_batches, stack, len(sent))
    relay_upstream = _assert_fewer_requests_upstream(run, client_produce, upstream_batches)
    produce_connections = _assert_only_lanes_upstream(run)
    assert run.metrics_after.value("kipside_lane_failures_total") == 0
    print(
        f"\nclients: {len(specs)} producers, {len(client_produce)} ProduceRequests "
        f"({len(client_batches)} batches, {len(sent)} records); upstream: {relay_upstream} "
        f"ProduceRequests on {len(produce_connections)} connections "
        f"(peak open {run.after.peak_open}, accepted in total {run.after.accepted}); "
        f"capture: {run.capture.packets} packets, {run.capture.drops} dropped"
    )
