"""`kipside mirror --exactly-once`: read_committed consumers of the destination see every source
record once, across SIGKILL of the mirror at any moment.

The destination is audited from its log, not through a consumer: Tansu's Fetch carries no
AbortedTransactions, so its read_committed consumers would return aborted records too. Each
destination partition is read raw (control batches included) and the transaction markers
applied as read_committed is specified (tests/integration/txn_log.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import create_topics, fresh_topic
from integration.txn_log import read_log, resolve
from testkit.broker import Broker
from testkit.produce import send_all

from kipside.pipeline.kafka.admin import committed_offsets
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.mirror.exactly_once import Resume, query_prefix
from kipside.pipeline.mirror.job import query_id
from kipside.protocol import Address

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


def _audit(dest: str, topic: str, partitions: int) -> dict[int, Counter[bytes]]:
    """Each destination partition's records as read_committed must see them (the log resolved
    by hand); nothing may be left in an open transaction."""
    out = {}
    for p in range(partitions):
        resolved = resolve(read_log(dest, topic, p))
        assert not resolved.still_open, f"{topic}-{p}: records in a transaction never ended"
        out[p] = Counter(resolved.committed)
    return out


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
    audit = _audit(dest_broker.bootstrap, "eo." + topic, 3)
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


class _Writer:
    """Uncompressed records with unique values written to a topic in a thread, about `rate` a
    second, round robin over its partitions, until stopped; every acknowledged value is kept."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int = 2000) -> None:
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            batch = []
            for _ in range(self.rate // 10):
                value = f"eos-{n:08d}".encode()
                batch.append({"value": value, "partition": n % self.partitions})
                self.sent[n % self.partitions].append(value)
                n += 1
            send_all(self.producer, self.topic, batch, self.errors)
            self._stop.wait(0.1)

    def stop(self) -> dict[int, list[bytes]]:
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(30) == 0 and not self.errors, self.errors[:3]
        return self.sent


def _committed_batches(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return len([f for f in folder.iterdir() if f.name.isdigit()]) if folder.exists() else 0


def _wait(proc: subprocess.Popen[str], done: Any, what: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the mirror exited {proc.returncode}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"not {what} within {seconds} s"
        time.sleep(0.1)


class _Group:
    """A consumer of a consumer group, in a thread until stopped. With `partitions` it reads
    them from the start (assigned, no rebalance to wait for) and commits what it read after
    every poll, synchronously (`committed`: its last commit); without, it joins the group
    (subscribe) and commits nothing: a member that is just there."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        partitions: int | None = None,
        *,
        pause: float = 0.0,
    ) -> None:
        self.consumer = ck.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.commits = partitions is not None
        if partitions is None:
            self.consumer.subscribe([topic])
        else:
            self.consumer.assign(
                [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)]
            )
        self.pause = pause
        self.committed: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            messages = self.consumer.consume(200, 0.2)
            if messages and self.commits:
                for tp in self.consumer.commit(asynchronous=False) or []:
                    if tp.offset >= 0:
                        self.committed[int(tp.partition)] = int(tp.offset)
            self._stop.wait(self.pause)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
        return self.committed


def _committed_in_log(dest: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the records read_committed sees, in log order."""
    records = read_log(dest, topic, partition)
    pending: dict[int, list[tuple[int, bytes]]] = {}
    out: list[tuple[int, bytes]] = []
    for r in sorted(records, key=lambda r: r.offset):
        if r.control is not None:
            if r.control == 1:
                out.extend(pending.pop(r.producer_id, []))
            else:
                pending.pop(r.producer_id, None)
        elif r.transactional:
            pending.setdefault(r.producer_id, []).append((r.offset, r.value or b""))
        else:
            out.append((r.offset, r.value or b""))
    return sorted(out)


KILLS = int(os.environ.get("KIPSIDE_TEST_KILLS", "5"))


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
    writer = _Writer(source_broker.bootstrap, topic, 3)
    billing = _Group(source_broker.bootstrap, topic, "billing", 3, pause=0.5)
    # "live" commits on the source; on the destination it has a member throughout, which
    # commits nothing: whatever "live" has committed there at the end, --sync-groups wrote.
    create_topics(dest_broker.bootstrap, ["ek." + topic], 3)
    live_source = _Group(source_broker.bootstrap, topic, "live", 3)
    live_dest = _Group(dest_broker.bootstrap, "ek." + topic, "live")
    try:
        for kill in range(KILLS):
            mirror = start_cli("mirror", *args)
            before = _committed_batches(checkpoint)
            _wait(mirror, lambda: _committed_batches(checkpoint) > before, "copying")  # noqa: B023
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

    def drained() -> bool:
        commits = sorted(
            int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()
        )
        offsets = (checkpoint / "offsets" / str(commits[-1])).read_text().splitlines()[-1]
        return {int(p): o for p, o in json.loads(offsets)[topic].items()} == ends

    try:
        _wait(last, drained, "drained")
        time.sleep(3)  # a few --sync-groups rounds after the last copy
        last.send_signal(signal.SIGTERM)
        _out, err = last.communicate(timeout=120)
        assert last.returncode == 0, err[-3000:]
    finally:
        live_dest.stop()
    assert "--sync-groups:" in err, err[-2000:]

    # Exactly once: every source record in a committed transaction once, none lost.
    audit = _audit(dest_broker.bootstrap, "ek." + topic, 3)
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
            for o, v in _committed_in_log(dest_broker.bootstrap, "ek." + topic, p)
            if o >= dest_offset
        ]
        assert following == sent[p][source_offset:], f"partition {p}: billing resumes elsewhere"
    assert all(off == live_dest.committed.get(p) for (_t, p), off in live_dest_offsets.items()), (
        "--sync-groups moved a group with an active member on the destination"
    )
