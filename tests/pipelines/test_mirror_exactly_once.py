"""`kipside mirror --exactly-once`: read_committed consumers of the destination see every source
record once, across SIGKILL of the mirror at any moment.

The destination is audited from its log, not through a consumer: Tansu's Fetch carries no
AbortedTransactions, so its read_committed consumers would return aborted records too. Each
destination partition is read raw (control batches included) and the transaction markers
applied as read_committed is specified (tests/integration/txn_log.py).
"""

from __future__ import annotations

import json
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import create_topics, fresh_topic
from integration.txn_log import read_log
from testkit.broker import Broker

from kipside.pipeline.kafka.admin import committed_offsets
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.mirror.exactly_once import Resume, query_prefix
from kipside.pipeline.mirror.job import query_id
from kipside.protocol import Address

from . import eos_kit as kit
from .conftest import mirror_once, run_in_process, start_cli
from .kafka_data import produce_plain

pytestmark = [pytest.mark.integration]


def test_resume_skips_only_what_a_committed_transaction_holds() -> None:
    assert Resume(None).copies(0)
    assert not Resume(100).copies(99), "ends below the committed offset: on the destination"
    assert Resume(100).copies(100) and Resume(100).copies(150)


def test_the_query_id_is_sparks_and_survives_restarts(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    first = query_id(str(checkpoint))
    assert json.loads((checkpoint / "metadata").read_text()) == {"id": first}
    assert query_id(str(checkpoint)) == first
    assert query_prefix(first) != query_prefix(query_id(str(tmp_path / "other")))


@pytest.mark.spark
def test_each_partition_is_copied_in_transactions_with_its_progress(
    spark: Any, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "eos", 3)
    sent = []
    for chunk in range(6):  # several batches per partition, so several micro-batches
        sent += produce_plain(
            source_broker.bootstrap, topic, 3, 100, start=100 * chunk, codec="none"
        )
    clusters = source_broker.bootstrap, dest_broker.bootstrap
    job = mirror_once(
        *clusters,
        topic,
        tmp_path / "ck",
        rename="eo.",
        exactly_once=True,
        max_bytes_per_trigger=8192,
    )
    query = run_in_process(spark, job)
    assert len([p for p in query.recentProgress if p.numInputRows]) >= 2
    audit = kit.audit(dest_broker.bootstrap, "eo." + topic, 3)
    for p in range(3):
        want = [r.value or b"" for r in sent if r.partition == p]  # the audit reads null as b""
        assert audit[p] == Counter(want), f"partition {p}: not exactly the source's records"
        raw = read_log(dest_broker.bootstrap, "eo." + topic, p)
        assert all(r.transactional for r in raw), "every batch written in a transaction"
        assert any(r.control == 1 for r in raw), "committed"
    group = query_prefix(query_id(str(tmp_path / "ck")))
    with KafkaClient(Address.parse_list(dest_broker.bootstrap, what="dest"), role="dest") as dest:
        progress = committed_offsets(dest, group)
    assert progress == {("eo." + topic, p): 200 for p in range(3)}


KILLS = 5


@pytest.mark.spark
@pytest.mark.hard_limit(600)
def test_sigkill_at_random_moments_loses_nothing_duplicates_nothing_and_syncs_groups(
    source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    """--exactly-once and --sync-groups together, the mirror killed 5 times at random moments
    while a producer writes and a consumer group reads and commits on the source."""
    topic = fresh_topic(source_broker.bootstrap, "eos-kill", 3)
    checkpoint = tmp_path / "ck"
    args = ["--source", source_broker.bootstrap, "--dest", dest_broker.bootstrap]
    args += ["--topics", re.escape(topic), "--rename", "ek.", "--checkpoint", str(checkpoint)]
    args += ["--exactly-once", "--max-bytes-per-trigger", "64K"]
    args += ["--sync-groups", "billing|live", "--sync-groups-interval", "1"]
    rng = random.Random()
    writer = kit.Writer(source_broker.bootstrap, topic, 3)
    billing = kit.Group(source_broker.bootstrap, topic, "billing", 3, pause=0.5)
    # "live" commits on the source; on the destination it has a member throughout, which
    # commits nothing: whatever "live" has committed there at the end, --sync-groups wrote.
    create_topics(dest_broker.bootstrap, ["ek." + topic], 3)
    live_source = kit.Group(source_broker.bootstrap, topic, "live", 3)
    live_dest = kit.Group(dest_broker.bootstrap, "ek." + topic, "live")
    try:
        for kill in range(KILLS):
            mirror = start_cli("mirror", *args)
            before = kit.committed_batches(checkpoint)
            kit.wait(mirror, lambda: kit.committed_batches(checkpoint) > before, "copying")  # noqa: B023
            moment = rng.uniform(0, 3)
            time.sleep(moment)
            mirror.send_signal(signal.SIGKILL)
            mirror.communicate(timeout=60)
            print(f"kill {kill + 1}: {moment:.2f} s after a micro-batch committed")
    finally:
        sent = writer.stop()
        billing_at = billing.stop()
        live_source.stop()
    ends = {p: len(values) for p, values in sent.items()}
    last = start_cli("mirror", *args)

    try:
        kit.wait(last, lambda: kit.drained(checkpoint, topic, ends), "drained")
        time.sleep(3)  # a few --sync-groups rounds after the last copy
        last.send_signal(signal.SIGTERM)
        _out, err = last.communicate(timeout=120)
        assert last.returncode == 0, err[-3000:]
    finally:
        live_dest.stop()
    assert "--sync-groups:" in err, err[-2000:]

    # Exactly once: every source record in a committed transaction once, none lost.
    audit = kit.audit(dest_broker.bootstrap, "ek." + topic, 3)
    for p in range(3):
        copies = audit[p]
        lost = [v for v in sent[p] if v not in copies]
        twice = [v for v, n in copies.items() if n > 1]
        assert not lost and not twice and sum(copies.values()) == len(sent[p]), (
            f"partition {p}: {len(lost)} lost, {len(twice)} duplicated of {len(sent[p])}"
        )

    # Group sync: billing resumes on the destination at exactly the record it would read next
    # on the source; live, with a member on the destination, was never touched there.
    with KafkaClient(Address.parse_list(dest_broker.bootstrap, what="dest"), role="dest") as dest:
        billing_dest = committed_offsets(dest, "billing")
        live_dest_offsets = committed_offsets(dest, "live")
    assert billing_at, "the billing group committed on the source"
    for p, source_offset in billing_at.items():
        dest_offset = billing_dest[("ek." + topic, p)]
        following = [
            v
            for o, v in kit.committed_in_log(dest_broker.bootstrap, "ek." + topic, p)
            if o >= dest_offset
        ]
        assert following == sent[p][source_offset:], f"partition {p}: billing resumes elsewhere"
    assert all(off == live_dest.committed.get(p) for (_t, p), off in live_dest_offsets.items()), (
        "--sync-groups moved a group with an active member on the destination"
    )
