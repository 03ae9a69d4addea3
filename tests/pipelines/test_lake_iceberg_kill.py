"""`kipside lake --format iceberg` killed with SIGKILL again and again, then audited record by
record with pyiceberg: every committed record once in the records table or the quarantine
table, and every snapshot a whole number of micro-batches.

One kill is at the fault-injection point between the data files and the snapshot commit
(files written, nothing committed: they must stay invisible and land once on restart); the
others are at random moments of a running ingestion (the seed is printed on failure)."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import fresh_topic
from testkit.broker import Broker

from .conftest import run_cli, start_cli
from .iceberg_kit import QUARANTINE, check_whole_micro_batches, duplicates, rows, schema_file, table
from .kafka_data import consume_all, produce_json_dataset

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3
RANDOM_KILLS = 4
CRASH_BEFORE_COMMIT = "KIPSIDE_LAKE_CRASH_BEFORE_COMMIT"  # the product's fault point


def _committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len(list(commits.glob("[0-9]*"))) if commits.exists() else 0


@pytest.mark.hard_limit(900)
def test_sigkill_of_the_driver_commits_every_record_once(
    source_broker: Broker, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic = fresh_topic(source_broker.bootstrap, "lake-ice-kill", PARTITIONS)
    data = produce_json_dataset(source_broker.bootstrap, topic, PARTITIONS, per_codec=160)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    args = [
        "lake", "--format", "iceberg", "--bootstrap", source_broker.bootstrap,
        "--topics", re.escape(topic), "--schema", str(schema_file(tmp_path)),
        "--out", str(out), "--checkpoint", str(checkpoint),
        "--max-offsets-per-trigger", "100", "--trigger-interval", "0",
    ]  # fmt: skip

    # 1. Killed once micro-batch 1 has written its data files, before it commits them.
    crashed = run_cli(*args, "--once", env={CRASH_BEFORE_COMMIT: "1"})
    assert crashed.code == -signal.SIGKILL, crashed.explain()
    committed = {f.file.file_path for f in table(out).scan().plan_files()}
    on_disk = {p.as_uri() for p in (out / "kipside" / "lake").rglob("*.parquet")}
    assert on_disk - committed, "no data files were written before the kill"
    assert len(table(out).snapshots()) == 1, "micro-batch 1 was committed before the kill"

    # 2. Killed at random moments of a running ingestion.
    moments = []
    for _ in range(RANDOM_KILLS):
        done = _committed_batches(checkpoint)
        live = start_cli(*args, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 240
        while _committed_batches(checkpoint) <= done:
            assert live.poll() is None, f"seed {seed}: " + live.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"seed {seed}: no micro-batch in 240 s"
            time.sleep(0.05)
        moment = rng.uniform(0.0, 3.0)
        moments.append(round(moment, 2))
        time.sleep(moment)
        live.send_signal(signal.SIGKILL)
        live.communicate(timeout=60)

    # 3. The rest, then the audit.
    final = run_cli(*args, "--once")
    assert final.code == 0, final.explain()
    consumed = consume_all(source_broker.bootstrap, topic, PARTITIONS)
    place = {r.value: (p, off) for p, items in consumed.items() for off, r in items}
    good = {place[json.dumps(v).encode()] for _, v, _ in data.good}
    found = rows(out)
    why = f"seed {seed}, kills after {moments} s"
    assert not duplicates(found), f"{why}: a record was committed twice"
    assert {(r["kafka_partition"], r["kafka_offset"]) for r in found} == good, why
    bad = rows(out, QUARANTINE)
    assert not duplicates(bad), f"{why}: a quarantined value was committed twice"
    assert len(bad) == len(data.bad), why
    check_whole_micro_batches(out, topic, good)
