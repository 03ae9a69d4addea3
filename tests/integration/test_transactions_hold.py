"""The begin hold against the coordinator's CONCURRENT_TRANSACTIONS window, end to end: real
clients -> kipside -> MarkerWindowRelay -> Tansu (txn_kit.py says what the stack simulates).

- A hold shorter than the window gives the client the real CONCURRENT_TRANSACTIONS, which the
  client handles itself: the positive control that the clients' own logs (txn_kit's
  RdkafkaLog, KafkaPythonTxnLog) do see it when a client gets it.
- What the hold costs the coordinator: librdkafka's transactions back to back, straight
  through the relay and through kipside, counting the window's refusals each way
  (docs/transactions.md shows the measurement).

Run: .venv/bin/pytest tests/integration/test_transactions_hold.py -q -s -p no:cacheprovider
"""

from __future__ import annotations

import time
from collections import Counter

import confluent_kafka as ck
import pytest
from conftest import create_topics, unique_name
from txn_relay import DESCRIBE

from . import txn_kit as kit
from .clients_confluent import ck_consumer
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration

TIMEOUT_WINDOW_MS = 2000.0  # hold-timeout test: a window far longer than the hold
TIMEOUT_HOLD_MAX_MS = 100


make_stack = kit.make_stack


@pytest.mark.parametrize("client", kit.CLIENTS)
def test_hold_timeout_returns_concurrent_transactions(
    client: str, make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> None:
    """hold_begin.max_ms = 100 against a 2 s marker window: kipside stops holding after
    ~100 ms and gives the client the real CONCURRENT_TRANSACTIONS, which the client then
    handles itself (librdkafka and kafka-python retry the add after their own backoff, so the
    transaction still commits once the window is over)."""
    topic, group = unique_name("hold", request), unique_name("g", request)
    rules = kit.rules_yaml("hold-*", [kit.Output(topic)], group, TIMEOUT_HOLD_MAX_MS)
    stack = make_stack(rules, window_ms=TIMEOUT_WINDOW_MS)
    create_topics(stack.bootstrap, [topic], kit.OUT_PARTITIONS)
    txn_id = unique_name("hold")
    producer = kit.TxnClient(client, stack.bootstrap, txn_id)
    try:
        producer.init()
        producer.produce_in_transaction(topic, [(p, b"t1") for p in range(kit.OUT_PARTITIONS)])
        producer.commit()  # the window opens
        assert not producer.concurrent_seen()
        started = time.monotonic()
        producer.produce_in_transaction(topic, [(p, b"t2") for p in range(kit.OUT_PARTITIONS)])
        waited = time.monotonic() - started
        producer.commit()
        seen = producer.concurrent_seen()
    finally:
        producer.close()
    stack.kipside.assert_alive()
    kit.assert_no_kipside_errors(stack.kipside)
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    counts = relay.counts()

    # kipside returned the real error many times within the window: its holds were short.
    assert len(seen) >= 3, f"{client} saw CONCURRENT_TRANSACTIONS {len(seen)} times"
    assert counts.rejected_add_partitions >= len(seen)
    # The client's own retries, not kipside, waited the window out.
    assert waited >= TIMEOUT_WINDOW_MS / 1000 * 0.5, f"the second transaction began in {waited}"
    ended = [s for s in relay.segments(txn_id) if s.end is not None]
    commits = sum(1 for s in ended if s.end and s.end.committed)
    # kipside ends a transaction it opened that the client thinks failed (its registration of
    # the declared group may succeed in the very attempt where the client's partitions get
    # the error): those aborts are kipside's, each logged.
    orphans = stack.kipside.log().count("kipside aborted that transaction")
    assert (commits, len(ended) - commits) == (2, orphans), ended
    log = [resolve(read_log(stack.bootstrap, topic, p)) for p in range(kit.OUT_PARTITIONS)]
    assert all(x.committed == [b"t1", b"t2"] and not x.still_open for x in log), log
    print(
        f"\n[{client}] hold max {TIMEOUT_HOLD_MAX_MS} ms vs window {TIMEOUT_WINDOW_MS:.0f} ms: "
        f"client saw CONCURRENT_TRANSACTIONS {len(seen)} times ({Counter(seen)}) while the "
        f"relay rejected {counts.rejected_add_partitions} AddPartitionsToTxn + "
        f"{counts.rejected_add_offsets} AddOffsetsToTxn; second transaction's add took "
        f"{waited:.2f} s; accepted upstream adds per transaction "
        f"{[(s.accepted_add_partitions, s.accepted_add_offsets) for s in ended]}; "
        f"kipside orphan aborts: {orphans}"
    )


# --------------------------------------------------------------------------- what the hold costs


COST_WINDOW_MS = 100.0  # long enough for several of librdkafka's 20 ms retries
COST_TRANSACTIONS = 8
COST_PARTITIONS = 4


def _tight_loop(bootstrap: str, txn_id: str, topic: str, group: str) -> list[str]:
    """librdkafka's transactions back to back, as bench/_txn_load.py runs them: begin, produce
    to every partition, send the offsets at once (its AddOffsetsToTxn goes while the adds
    are still refused), commit; returns the CONCURRENT_TRANSACTIONS answers it saw."""
    client = kit.TxnClient("confluent-kafka", bootstrap, txn_id)
    consumer = ck_consumer(bootstrap, group)
    try:
        metadata = consumer.consumer_group_metadata()
        client.init()
        for i in range(COST_TRANSACTIONS):
            client.ck.begin_transaction()
            for partition in range(COST_PARTITIONS):
                client.ck.produce(topic, value=f"{txn_id}-{i}".encode(), partition=partition)
            offsets = [ck.TopicPartition(topic, 0, i + 1)]
            client.ck.send_offsets_to_transaction(offsets, metadata, kit.CALL_TIMEOUT)
            client.commit()
        return client.concurrent_seen()
    finally:
        consumer.close()
        client.close()


def test_the_hold_costs_the_coordinator_no_more_than_the_client_alone(
    make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> None:
    """The same relay and marker window (100 ms after every EndTxn), the same loop of
    transactions by librdkafka: once straight through the relay, once through kipside (the
    rule declares the output topic and the group). The CONCURRENT_TRANSACTIONS answers the
    relay gave in the windows through kipside (its begin hold's probes) are no more than it
    gave librdkafka's own retries of AddPartitionsToTxn and AddOffsetsToTxn, and the client
    behind kipside saw none of them."""
    topic, group = unique_name("cost", request), unique_name("g", request)
    stack = make_stack(
        kit.rules_yaml("cost-via-*", [kit.Output(topic)], group, kit.HOLD_MAX_MS),
        window_ms=COST_WINDOW_MS,
    )
    create_topics(stack.bootstrap, [topic], COST_PARTITIONS)
    direct_id, via_id = unique_name("cost-direct"), unique_name("cost-via")
    direct_seen = _tight_loop(stack.broker.bootstrap, direct_id, topic, group)  # the relay's
    via_seen = _tight_loop(stack.bootstrap, via_id, topic, group)
    stack.kipside.assert_alive()
    kit.assert_no_kipside_errors(stack.kipside)
    relay = stack.relay
    assert not relay.problems(), relay.problems()

    def refused(txn_id: str) -> list[tuple[int, int]]:
        """Per transaction after the first (which follows no window): the relay's
        CONCURRENT_TRANSACTIONS answers to AddPartitionsToTxn and to AddOffsetsToTxn."""
        ended = [s for s in relay.segments(txn_id) if s.end is not None]
        assert len(ended) == COST_TRANSACTIONS, ended
        return [(s.rejected_add_partitions, s.rejected_add_offsets) for s in ended[1:]]

    direct, via = refused(direct_id), refused(via_id)
    direct_total, via_total = sum(map(sum, direct)), sum(map(sum, via))
    print(
        f"\n[hold cost] window {COST_WINDOW_MS:.0f} ms, {COST_TRANSACTIONS - 1} transactions "
        f"after one: CONCURRENT_TRANSACTIONS (AddPartitionsToTxn, AddOffsetsToTxn) per "
        f"transaction direct {direct} = {direct_total}, through kipside {via} = {via_total}; "
        f"seen by the client: direct {len(direct_seen)}, through kipside {len(via_seen)}"
    )
    assert direct_total >= COST_TRANSACTIONS - 1, "the window was not hit directly"
    assert via_total > 0, "kipside never met the window"
    assert via_total <= direct_total
    assert direct_seen and not via_seen
    # Both loops' transactions committed, each record once, in order, none left open.
    for partition in range(COST_PARTITIONS):
        log = resolve(read_log(stack.bootstrap, topic, partition))
        want = [f"{i}-{n}".encode() for i in (direct_id, via_id) for n in range(COST_TRANSACTIONS)]
        assert (log.committed, log.aborted, log.still_open) == (want, [], []), partition


TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


def test_a_coordinator_that_will_not_describe_is_asked_with_registrations(
    make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> None:
    """A coordinator that offers DescribeTransactions but answers it with an error (as Apache
    Kafka does a principal without Describe on the transactional id): kipside asks once, says
    so in its log, and from then on holds with the registration's own calls. Every
    transaction commits, and the client sees no CONCURRENT_TRANSACTIONS."""
    topic, group = unique_name("nodescribe", request), unique_name("g", request)
    stack = make_stack(
        kit.rules_yaml("nodescribe-*", [kit.Output(topic)], group, kit.HOLD_MAX_MS),
        window_ms=COST_WINDOW_MS,
        describe_transactions=True,
    )
    stack.relay.describe_error = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    create_topics(stack.bootstrap, [topic], COST_PARTITIONS)
    txn_id = unique_name("nodescribe")
    seen = _tight_loop(stack.bootstrap, txn_id, topic, group)
    stack.kipside.assert_alive()
    kit.assert_no_kipside_errors(stack.kipside)
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    asked = [e.error_code for e in relay.events(txn_id) if e.kind == DESCRIBE]
    assert asked == [TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    assert "the begin hold asks with registrations instead" in stack.kipside.log()
    assert not seen
    ended = [s for s in relay.segments(txn_id) if s.end is not None]
    assert [s.end.committed for s in ended if s.end] == [True] * COST_TRANSACTIONS
    assert sum(s.rejected_add_partitions for s in ended) > 0  # it held, with registrations
    for partition in range(COST_PARTITIONS):
        log = resolve(read_log(stack.bootstrap, topic, partition))
        want = [f"{txn_id}-{n}".encode() for n in range(COST_TRANSACTIONS)]
        assert (log.committed, log.aborted, log.still_open) == (want, [], []), partition
