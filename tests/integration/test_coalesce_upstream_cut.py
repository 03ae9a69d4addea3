"""Coalescing lanes cut under load: real clients -> kipside -> CountingRelay -> Tansu.

- test_upstream_cut_mid_flight_disconnects_affected_clients_and_loses_nothing: the relay cuts
  every upstream connection under load (once after holding requests in flight, once
  unannounced). kipside closes each client connection that had a batch in flight or queued on a
  cut lane, as a broker disconnect would; the clients see the disconnect (librdkafka and
  aiokafka retry, clients with retries=0 report a retriable connection error), resend in order,
  idempotent ones under the same sequence numbers and epoch: no batch reaches the broker ahead
  of its predecessor, nothing acknowledged is lost, idempotent producers write no duplicates.

The stack and the log checks are coalesce_kit's, the producer processes coalesce_producers'.

Run: .venv/bin/pytest tests/integration/test_coalesce_upstream_cut.py -q -p no:cacheprovider
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import create_topics, unique_name
from relays import BatchSeen, CountingRelay

from kipside.protocol.apis import ApiKey

from . import coalesce_kit as kit
from . import coalesce_producers as producers

pytestmark = pytest.mark.integration

# librdkafka (debug "msg"): a ProduceRequest written, and one failed by a lost connection.
RDKAFKA_PRODUCED = re.compile(
    r" (\S+) \[(\d+)\]: Produce MessageSet with \d+ message\(s\) \(.*BaseSeq (\d+), "
    r"PID\{Id:(\d+),Epoch:(\d+)\}"
)
RDKAFKA_TRANSPORT_FAILED = re.compile(
    r" (\S+) \[(\d+)\]: MessageSet with \d+ message\(s\) \(MsgId \d+, BaseSeq (\d+)\) "
    r"encountered error: Local: Broker transport failure"
)


stack = kit.stack_fixture("stack", kafka_acks0=True)


def _cut_specs(targets: list[tuple[str, int]]) -> list[producers.ProducerSpec]:
    endless: dict[str, Any] = {"conf": {}, "messages": 1_000_000, "pause_every": 2, "pause": 0.004}
    no_retry = {**endless, "conf": {"retries": 0}}  # until told to stop, either way
    rows: list[tuple[str, str, int, bool, str, int, dict[str, Any]]] = [
        # name, library, acks, idempotent, compression, rotation of the targets, the rest
        ("idem-lz4", "confluent-kafka", -1, True, "lz4", 0, {**endless, "debug": "msg"}),
        ("idem-zstd", "confluent-kafka", -1, True, "zstd", 3, {**endless, "debug": "msg"}),
        ("all-gzip", "confluent-kafka", -1, False, "gzip", 5, endless),
        ("ck-noretry", "confluent-kafka", 1, False, "none", 2, no_retry),
        ("kp-noretry", "kafka-python", 1, False, "gzip", 6, no_retry),
        ("aio-acks1", "aiokafka", 1, False, "snappy", 1, endless),
    ]
    return [
        producers.ProducerSpec(
            name, lib, acks, idem, codec, targets=producers.rotated(targets, turn), **rest
        )
        for name, lib, acks, idem, codec, turn, rest in rows
    ]


@dataclass
class CutRun:
    """Producers that ran through two cuts of every upstream connection."""

    outcomes: dict[str, producers.Outcome]
    mark: int  # kipside's log from just before the first cut
    first_cut: int  # connections the relay cut, the first time
    second_cut: int
    accepted_before_cut: int  # upstream connections the relay had accepted by then


def _cut_twice_under_load(
    stack: kit.Stack, specs: list[producers.ProducerSpec], tmp_path: Path
) -> CutRun:
    """Run the producers; under load, cut every upstream connection twice: first with requests
    held in flight on the lanes (and more queued behind them, from every producer), then with
    no warning; stop the producers and collect what each saw."""
    fleet = producers.ProducerFleet(specs, stack.kipside.bootstrap, tmp_path)
    relay = stack.relay
    try:
        fleet.start()
        fleet.go.set()
        start = relay.counts().requests[ApiKey.PRODUCE]
        kit.wait_until(
            lambda: relay.counts().requests[ApiKey.PRODUCE] > start + 50, 30, "produce traffic"
        )
        mark = stack.kipside.log_mark()
        accepted_before_cut = relay.counts().accepted
        # Hold what kipside sends upstream so that requests are certainly in flight on the
        # lanes (and more queue behind them, from every producer), then cut every connection.
        relay.hold()
        kit.wait_until(lambda: relay.counts().held_now >= 1, 10, "a request held in flight")
        time.sleep(0.5)
        first_cut = relay.cut_all()
        relay.release()
        assert stack.kipside.wait_for_log(kit.LANE_FAILED_LINE.search, mark, timeout=10), (
            f"kipside logged no lane failure:\n{stack.kipside.log()[-3000:]}"
        )
        time.sleep(1.5)  # producers carry on over re-dialled lanes...
        second_cut = relay.cut_all()  # ...and lose them again, this time with no warning
        time.sleep(1.5)
        fleet.stop.set()
        outcomes = {o.spec.name: o for o in fleet.join(producers.PRODUCE_TIMEOUT + 30)}
    finally:
        fleet.kill()
    return CutRun(outcomes, mark, first_cut, second_cut, accepted_before_cut)


@dataclass
class Closures:
    """What kipside logged about the cut: per lane, and per client connection it closed."""

    lane_lines: list[re.Match[str]]
    short_api_lines: list[re.Match[str]]
    closed_for_batches: Counter[str]  # client ids closed for their batches on a cut lane
    closed_at_all: Counter[str]  # and those closed for a short API's lost answer


def _assert_kipside_closed_affected_clients(
    stack: kit.Stack, run: CutRun, specs: list[producers.ProducerSpec]
) -> Closures:
    """kipside closed the client connections that had a batch in flight or queued on a cut
    lane, and said so: per lane, and per client connection; it re-dialled its lanes."""
    metrics = stack.metrics()
    assert run.first_cut >= 1 and run.second_cut >= 1, (run.first_cut, run.second_cut)
    log = stack.kipside.log_since(run.mark).splitlines()
    lane_lines = [m for ln in log if (m := kit.LANE_FAILED_LINE.search(ln))]
    assert lane_lines, f"no lane failure in kipside's log:\n{stack.kipside.log()[-3000:]}"
    assert all(int(m.group(2)) == 111 for m in lane_lines), [m.group(0) for m in lane_lines]
    closed_per_lane = [int(m.group(5)) for m in lane_lines]
    assert sum(closed_per_lane) > 0, [m.group(0) for m in lane_lines]
    for m in lane_lines:
        batches, closed = int(m.group(4)), int(m.group(5))
        # Connections, not requests: at most one per producer (each has one to node 111).
        assert 1 <= closed <= min(batches, len(specs)), m.group(0)
    client_lines = [m for ln in log if (m := kit.CLIENT_CLOSED_LINE.search(ln))]
    short_api_lines = [m for ln in log if (m := kit.CLOSED_FOR_SHORT_API_LINE.search(ln))]
    assert client_lines, "kipside named no client connection it closed"
    assert len(client_lines) <= sum(closed_per_lane), (len(client_lines), closed_per_lane)
    assert all(m.group(4) == "111" for m in client_lines), [m.group(0) for m in client_lines]
    closed_for_batches = Counter(m.group(2) for m in client_lines)
    closed_at_all = closed_for_batches + Counter(m.group(2) for m in short_api_lines)
    assert set(closed_at_all) <= {s.name for s in specs}, closed_at_all
    assert metrics.value("kipside_lane_failures_total") >= 1
    assert stack.relay.counts().accepted > run.accepted_before_cut, (
        "kipside never re-dialled its lanes"
    )
    assert metrics.value("kipside_upstream_connections") <= kit.LANES * kit.BROKERS
    return Closures(lane_lines, short_api_lines, closed_for_batches, closed_at_all)


def _assert_clients_saw_disconnect(
    outcomes: dict[str, producers.Outcome], closures: Closures
) -> tuple[Counter[Any], Counter[Any]]:
    """Each closed client saw a disconnect, as from a broker; those that do not retry report
    a retriable error, those that do got everything through. Returns the errors kafka-python
    and confluent-kafka reported."""
    closed_for_batches = closures.closed_for_batches
    for name in closures.closed_at_all:
        if outcomes[name].spec.library == "confluent-kafka":
            assert any("Disconnected" in ln for ln in outcomes[name].log), (
                f"{name}: librdkafka logged no disconnect: {outcomes[name].log[:5]}"
            )
    # Clients that do not retry saw a retriable error for the batches that were in flight.
    kp_errors = Counter((f[3], f[4], f[5]) for f in outcomes["kp-noretry"].failed)
    if closed_for_batches["kp-noretry"]:
        assert kp_errors[(None, "KafkaConnectionError", True)] > 0, kp_errors
        assert any("Connection lost" in ln for ln in outcomes["kp-noretry"].log)
    assert all(f[5] for f in outcomes["kp-noretry"].failed), outcomes["kp-noretry"].failed[:5]
    # librdkafka's delivery report says retriable() False once its retries (0 here) are spent;
    # the code is its local transport failure, which librdkafka retries when it may (the
    # idempotent producers' resends below).
    ck_errors = Counter((f[3], f[4]) for f in outcomes["ck-noretry"].failed)
    if closed_for_batches["ck-noretry"]:
        assert ck_errors[(-195, "_TRANSPORT")] > 0, ck_errors
    assert set(ck_errors) <= {(-195, "_TRANSPORT")}, ck_errors
    # Clients that retry got everything through after the disconnect.
    if closed_for_batches["aio-acks1"]:
        lost_connection = "Got error produce response: KafkaConnectionError"
        aio_log = outcomes["aio-acks1"].log
        assert any(lost_connection in ln for ln in aio_log), aio_log[:5]
    for name in ("all-gzip", "aio-acks1", "idem-lz4", "idem-zstd"):
        assert not outcomes[name].failed, (name, outcomes[name].failed[:5])
    return kp_errors, ck_errors


def _assert_idempotent_resent_in_place(
    outcomes: dict[str, producers.Outcome], closed_for_batches: Counter[str]
) -> dict[str, int]:
    """The idempotent producers resent, on their new connection, every batch the disconnect
    failed, under the same sequence number and epoch: librdkafka's own log. Returns how many
    batches each resent."""
    resends = {}
    for name in ("idem-lz4", "idem-zstd"):
        lines = list(enumerate(outcomes[name].log))
        produced = [(i, m.groups()) for i, ln in lines if (m := RDKAFKA_PRODUCED.search(ln))]
        failed = [(i, m.groups()) for i, ln in lines if (m := RDKAFKA_TRANSPORT_FAILED.search(ln))]
        if closed_for_batches[name]:
            assert failed, f"{name}: librdkafka logged no batch failed by the disconnect"
        assert {g[4] for _, g in produced} == {"0"}, f"{name} bumped its epoch"
        for i, batch in failed:
            resent_after = [j for j, g in produced if j > i and g[:3] == batch]
            assert resent_after, f"{name}: {batch} (topic, partition, sequence) never resent"
        resends[name] = len(failed)
    return resends


def _assert_broker_saw_no_gap(relay: CountingRelay) -> tuple[int, list[BatchSeen]]:
    """The broker never saw a batch ahead of its predecessor (no OUT_OF_ORDER_SEQUENCE_NUMBER,
    hence no epoch bump and no fencing), whatever was resent. Returns how many batches were
    resent upstream, and the idempotent batches."""
    upstream = relay.batches()
    gaps, resent = kit.sequence_gaps(upstream)
    assert not gaps, gaps[:10]
    idempotent_batches = [b for b in upstream if b.producer_id >= 0]
    assert {b.producer_epoch for b in idempotent_batches} == {0}
    return resent, idempotent_batches


def _assert_nothing_acknowledged_lost(
    stack: kit.Stack,
    targets: list[tuple[str, int]],
    outcomes: dict[str, producers.Outcome],
    specs: list[producers.ProducerSpec],
) -> tuple[set[tuple[str, int]], list[kit.LogRecord]]:
    """Nothing acknowledged was lost; idempotent producers wrote nothing twice, in order.
    Returns what was acknowledged and what the log holds."""
    delivered = {(o.spec.name, seq) for o in outcomes.values() for seq, _, _ in o.delivered}
    records = kit.consume_everything(stack.kipside.bootstrap, targets, at_least=len(delivered))
    counts = kit.log_index(records)
    lost = sorted(delivered - set(counts))
    assert not lost, f"{len(lost)} acknowledged messages are not in the log: {lost[:10]}"
    idempotent = {s.name for s in specs if s.idempotent}
    dups = {k: n for k, n in counts.items() if k[0] in idempotent and n > 1}
    assert not dups, f"idempotent producers' duplicates: {list(dups.items())[:10]}"
    kit.assert_order_per_partition(records, idempotent)
    return delivered, records


def test_upstream_cut_mid_flight_disconnects_affected_clients_and_loses_nothing(
    stack: kit.Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topics = [unique_name(f"cut{t}", request) for t in range(2)]
    create_topics(stack.kipside.bootstrap, topics, kit.PARTITIONS)
    targets = producers.targets_of(topics, kit.PARTITIONS)
    specs = _cut_specs(targets)
    run = _cut_twice_under_load(stack, specs, tmp_path)
    stack.kipside.assert_alive()
    closures = _assert_kipside_closed_affected_clients(stack, run, specs)

    outcomes = run.outcomes
    for o in outcomes.values():
        assert o.error is None, f"{o.spec.name} crashed:\n{o.error}"
        assert o.undelivered == 0, f"{o.spec.name}: {o.undelivered} never reported"
        assert o.delivered, f"{o.spec.name} delivered nothing"
    kp_errors, ck_errors = _assert_clients_saw_disconnect(outcomes, closures)
    resends = _assert_idempotent_resent_in_place(outcomes, closures.closed_for_batches)
    resent, idempotent_batches = _assert_broker_saw_no_gap(stack.relay)
    delivered, records = _assert_nothing_acknowledged_lost(stack, targets, outcomes, specs)
    print(
        f"\ncuts: {run.first_cut} + {run.second_cut} connections; kipside: "
        + "; ".join(
            f"lane {m.group(1)}: {m.group(4)} batches, {m.group(5)} clients"
            for m in closures.lane_lines
        )
        + f"; closed for batches {dict(closures.closed_for_batches)}, for short APIs "
        f"{dict(Counter(m.group(2) for m in closures.short_api_lines))}; client errors: "
        f"kafka-python {dict(kp_errors)}, confluent {dict(ck_errors)}; idempotent batches "
        f"failed by the disconnect and resent {resends}; resent upstream {resent} of "
        f"{len(idempotent_batches)}; delivered {len(delivered)}, in log {len(records)}"
    )
