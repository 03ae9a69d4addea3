"""Pre-registration of a rule's declared outputs when some of them don't exist, end to end:
confluent-kafka -> kipside -> MarkerWindowRelay -> Tansu (txn_kit.py says what the stack
simulates). The relay refuses unknown topics in AddPartitionsToTxn the way Apache Kafka does;
kipside keeps the valid declared outputs, skips the refused ones after the first refusal, and
logs each rule problem once, while the client's transactions go on as if nothing were declared.

(test_transactions_ctp.py checks pre-registration when every declared output exists.)

Run: .venv/bin/pytest tests/integration/test_transactions_preregistration.py -q -p no:cacheprovider
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from conftest import create_topics, unique_name

from . import txn_kit as kit
from .clients_confluent import ck_config
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration

TRANSACTIONS = 5


make_stack = kit.make_stack


def _transactions_in_two_adds(
    bootstrap: str, topic: str, group: str, txn_id: str
) -> tuple[list[str], list[str]]:
    """TRANSACTIONS committed transactions of "t{i}" to every partition of `topic` and the
    group's offsets; returns the CONCURRENT_TRANSACTIONS answers librdkafka saw and its
    "Failed to add" log lines."""
    producer = kit.TxnClient("confluent-kafka", bootstrap, txn_id)
    try:
        producer.init()
        for i in range(TRANSACTIONS):
            # Partition 0 first, the rest once it is registered: the second AddPartitionsToTxn
            # is covered by pre-registration only if kipside kept the valid declared outputs.
            value = f"t{i}".encode()
            producer.produce_in_transaction(topic, [(0, value)])
            values = [(p, value) for p in range(1, kit.OUT_PARTITIONS)]
            producer.produce_in_transaction(topic, values, begin=False)
            producer.send_offsets(topic, i + 1, group)
            producer.commit()
        seen = producer.concurrent_seen()
        assert producer.rdkafka_log is not None
        failed_adds = [ln for ln in producer.rdkafka_log.lines if "Failed to add" in ln]
    finally:
        producer.close()
    return seen, failed_adds


def _rule_problems_logged_once(kipside_log: str, missing_all: str, missing_some: str) -> list[str]:
    """kipside's one line about each missing output; returns them."""
    about_all = [ln for ln in kipside_log.splitlines() if repr(missing_all) in ln]
    about_some = [ln for ln in kipside_log.splitlines() if missing_some in ln]
    assert len(about_all) == 1 and "does not know" in about_all[0], about_all
    assert len(about_some) == 1 and "refused" in about_some[0], about_some
    return about_all + about_some


def test_missing_declared_output_topic(
    make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> None:
    """A rule declaring outputs that don't exist (one "all partitions", one with explicit
    partitions, which the relay refuses the way Apache Kafka refuses unknown topics in
    AddPartitionsToTxn) doesn't break the client's transactions: every commit succeeds, the
    records are committed, and kipside logs each rule problem once."""
    topic, group = unique_name("real", request), unique_name("g", request)
    missing_all = unique_name("missing-all", request)
    missing_some = unique_name("missing-some", request)
    outputs = [kit.Output(topic), kit.Output(missing_all), kit.Output(missing_some, (0, 1))]
    stack = make_stack(kit.rules_yaml("miss-*", outputs, group, kit.HOLD_MAX_MS))
    stack.relay.unknown_topics = frozenset({missing_all, missing_some})
    create_topics(stack.bootstrap, [topic], kit.OUT_PARTITIONS)
    txn_id = unique_name("miss")
    seen, failed_adds = _transactions_in_two_adds(stack.bootstrap, topic, group, txn_id)
    stack.kipside.assert_alive()
    kit.assert_no_kipside_errors(stack.kipside)
    assert not seen and not failed_adds, (seen, failed_adds)
    log = [resolve(read_log(stack.bootstrap, topic, p)) for p in range(kit.OUT_PARTITIONS)]
    want = [f"t{i}".encode() for i in range(TRANSACTIONS)]
    assert all(x.committed == want and not x.still_open for x in log), log

    logged = _rule_problems_logged_once(stack.kipside.log(), missing_all, missing_some)
    relay = stack.relay
    assert not relay.problems(), relay.problems()
    ended = [s for s in relay.segments(txn_id) if s.end is not None]
    assert len(ended) == TRANSACTIONS
    # The first transaction learns of the refusal (one refused, one accepted add); later ones
    # skip the refused outputs and keep the valid ones: one accepted add each, none refused.
    per_txn = [(s.accepted_add_partitions, s.refused_add_partitions) for s in ended]
    assert per_txn == [(1, 1)] + [(1, 0)] * (TRANSACTIONS - 1), per_txn
    admin_names = AdminClient(ck_config(stack.bootstrap)).list_topics(timeout=10).topics
    assert missing_all not in admin_names and missing_some not in admin_names
    print(
        f"\n[missing outputs] per transaction (accepted, refused) AddPartitionsToTxn upstream: "
        f"{per_txn}; kipside log: {logged}"
    )
