"""`kipside lake` killed with SIGKILL again and again, in each table format, then audited record
by record outside Spark: every committed record once in the records table or the quarantine,
and nothing of the commit protocol left behind.

One kill is at the product's fault point (pipeline/lake/faults.py), the most dangerous moment
of micro-batch 1's commit: for Iceberg, data files written and nothing committed (they must
stay invisible); for plain Parquet, the manifest written and one file renamed into place, the
others still staged (a reader sees part of the micro-batch until the restart removes it). The
others are at random moments of a running ingestion (the seed is printed on failure)."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import fresh_topic
from testkit.broker import Broker

from kipside.pipeline.lake.faults import CRASH_BEFORE_COMMIT

from . import iceberg_kit
from .conftest import run_cli, start_cli
from .iceberg_kit import duplicates, schema_file
from .kafka_data import consume_all, produce_json_dataset

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3
RANDOM_KILLS = 4
CRASHED_BATCH = 1  # batch 0 committed before it, so the restart must keep one and redo the other

Rows = list[dict[str, Any]]
Place = tuple[int, int]


@dataclass(frozen=True)
class Format:
    """What differs between the table formats: how a reader outside Spark sees the records and
    the quarantine, what the fault point must have left, and what a finished run must have."""

    name: str
    records: Callable[[Path], Rows]
    quarantine: Callable[[Path], Rows]
    check_crashed: Callable[[Path], None]
    check_finished: Callable[[Path, str, set[Place]], None]


def _parquet_rows(path: Path) -> Rows:
    """pyarrow's view of a plain-Parquet table: hive partitions, `_` folders hidden."""
    rows: Rows = ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pylist()
    return rows


def _parquet_crashed(out: Path) -> None:
    meta = out / "_kipside"
    assert (meta / "commits" / str(CRASHED_BATCH - 1)).exists(), "the batch before was published"
    assert not (meta / "commits" / str(CRASHED_BATCH)).exists(), "committed before the kill"
    listed = (meta / "manifests" / str(CRASHED_BATCH)).read_text().split()
    placed = [p for p in listed if Path(p).exists()]
    assert len(placed) == 1 < len(listed), f"{len(placed)} of {len(listed)} files renamed"
    staged = list((meta / "staging" / str(CRASHED_BATCH)).rglob("*.parquet"))
    assert len(staged) == len(listed) - 1, "the files not yet renamed stay staged"


def _parquet_finished(out: Path, _topic: str, _good: set[Place]) -> None:
    meta = out / "_kipside"
    for step in ("staging", "manifests"):
        assert not list((meta / step).glob("*")), f"{step} left behind"


def _iceberg_crashed(out: Path) -> None:
    committed = {f.file.file_path for f in iceberg_kit.table(out).scan().plan_files()}
    on_disk = {p.as_uri() for p in (out / "kipside" / "lake").rglob("*.parquet")}
    assert on_disk - committed, "no data files were written before the kill"
    assert len(iceberg_kit.table(out).snapshots()) == CRASHED_BATCH, "committed before the kill"


def _iceberg_finished(out: Path, topic: str, good: set[Place]) -> None:
    iceberg_kit.check_whole_micro_batches(out, topic, good)


PARQUET = Format(
    "parquet",
    _parquet_rows,
    lambda out: _parquet_rows(out / "_quarantine"),
    _parquet_crashed,
    _parquet_finished,
)
ICEBERG = Format(
    "iceberg",
    iceberg_kit.rows,
    lambda out: iceberg_kit.rows(out, iceberg_kit.QUARANTINE),
    _iceberg_crashed,
    _iceberg_finished,
)


def _committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len(list(commits.glob("[0-9]*"))) if commits.exists() else 0


@pytest.mark.hard_limit(900)
@pytest.mark.parametrize("lake", [PARQUET, ICEBERG], ids=lambda f: f.name)
def test_sigkill_of_the_driver_commits_every_record_once(
    lake: Format, source_broker: Broker, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic = fresh_topic(source_broker.bootstrap, f"lake-kill-{lake.name}", PARTITIONS)
    data = produce_json_dataset(source_broker.bootstrap, topic, PARTITIONS, per_codec=160)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    args = [
        "lake", "--format", lake.name, "--bootstrap", source_broker.bootstrap,
        "--topics", re.escape(topic), "--schema", str(schema_file(tmp_path)),
        "--out", str(out), "--checkpoint", str(checkpoint),
        "--max-offsets-per-trigger", "100", "--trigger-interval", "0",
    ]  # fmt: skip

    # 1. Killed at the fault point of micro-batch 1's commit.
    crashed = run_cli(*args, "--once", env={CRASH_BEFORE_COMMIT: str(CRASHED_BATCH)})
    assert crashed.code == -signal.SIGKILL, crashed.explain()
    lake.check_crashed(out)

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
    found = lake.records(out)
    why = f"seed {seed}, kills after {moments} s"
    assert not duplicates(found), f"{why}: a record was committed twice"
    assert {(r["kafka_partition"], r["kafka_offset"]) for r in found} == good, why
    bad = lake.quarantine(out)
    assert not duplicates(bad), f"{why}: a quarantined value was committed twice"
    assert len(bad) == len(data.bad), why
    lake.check_finished(out, topic, good)
