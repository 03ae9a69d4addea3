"""The mirror's delivery guarantee across restarts, checked against the Spark checkpoint.

The mirror runs continuously in small micro-batches. It is killed with SIGKILL mid-stream,
started again, left to drain, then stopped with SIGTERM (it must let the running micro-batch
commit, so that stop copies nothing twice). Then every source record must be on the
destination, in order, and any record found twice must belong to the one micro-batch that was
running when SIGKILL hit: the documented at-least-once window (docs/mirror.md).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import fresh_topic
from testkit.broker import Broker

from .conftest import start_cli
from .kafka_data import consume_all, produce_plain

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 3
RECORDS = 24_000
START_DEADLINE = 180.0


def _offsets_file(checkpoint: Path, batch: int) -> dict[tuple[str, int], int]:
    """The end offsets of micro-batch `batch` in Spark's offset log."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    data = json.loads(lines[-1])
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


def _committed(checkpoint: Path) -> list[int]:
    folder = checkpoint / "commits"
    return (
        sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit()) if folder.exists() else []
    )


def _started(checkpoint: Path) -> list[int]:
    folder = checkpoint / "offsets"
    return (
        sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit()) if folder.exists() else []
    )


def _start(source: Broker, dest: Broker, topic: str, checkpoint: Path) -> subprocess.Popen[str]:
    args = ["--source", source.bootstrap, "--dest", dest.bootstrap, "--topics", re.escape(topic)]
    return start_cli(
        "mirror", *args, "--checkpoint", str(checkpoint), "--max-bytes-per-trigger", "32K"
    )


def _wait_for(proc: subprocess.Popen[str], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while not done():
        if proc.poll() is not None:
            raise AssertionError(
                f"mirror exited {proc.returncode}: {proc.communicate()[1][-3000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"not {what} within {START_DEADLINE} s")
        time.sleep(0.05)


def _drained(checkpoint: Path, ends: dict[tuple[str, int], int]) -> bool:
    committed = _committed(checkpoint)
    return bool(committed) and _offsets_file(checkpoint, committed[-1]) == ends


def test_restarts_lose_nothing_and_duplicate_only_the_killed_micro_batch(
    source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "mirror-restart", PARTITIONS)
    sent = produce_plain(source_broker.bootstrap, topic, PARTITIONS, RECORDS)
    ends = {(topic, p): len([r for r in sent if r.partition == p]) for p in range(PARTITIONS)}
    checkpoint = tmp_path / "checkpoint"

    # 1. SIGKILL mid-stream: whatever the running micro-batch wrote may be written again.
    first = _start(source_broker, dest_broker, topic, checkpoint)
    _wait_for(first, lambda: len(_committed(checkpoint)) >= 2, "two micro-batches committed")
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    committed, started = _committed(checkpoint), _started(checkpoint)
    uncommitted = [b for b in started if b not in committed]
    assert len(uncommitted) <= 1
    window_start = _offsets_file(checkpoint, committed[-1])
    window_end = _offsets_file(checkpoint, uncommitted[0]) if uncommitted else window_start
    assert not _drained(checkpoint, ends), "killed too late: nothing left to copy"

    # 2. Restart, let it drain, then SIGTERM: it stops between micro-batches, copying nothing twice.
    second = _start(source_broker, dest_broker, topic, checkpoint)
    _wait_for(second, lambda: _drained(checkpoint, ends), "the topic drained")
    second.send_signal(signal.SIGTERM)
    _out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    assert "kipside mirror: stopped:" in err and "lag 0" in err.splitlines()[-1], err[-2000:]
    assert _started(checkpoint) == _committed(checkpoint), "SIGTERM left a micro-batch uncommitted"

    source = consume_all(source_broker.bootstrap, topic, PARTITIONS)
    dest = consume_all(dest_broker.bootstrap, topic, PARTITIONS)
    for p in range(PARTITIONS):
        src = source[p]
        offset_of = {r: off for off, r in src}
        copies = Counter(r for _, r in dest[p])
        assert set(copies) == {r for _, r in src}, f"partition {p}: records lost or invented"
        duplicated = [offset_of[r] for r, n in copies.items() if n > 1]
        lo, hi = window_start.get((topic, p), 0), window_end.get((topic, p), 0)
        outside = [o for o in duplicated if not lo <= o < hi]
        assert not outside, (
            f"partition {p}: duplicates outside the killed micro-batch {lo}-{hi}: {outside[:5]}"
        )
        # Order: the first copy of each record comes in source order.
        firsts: list[int] = []
        seen: set[object] = set()
        for _, r in dest[p]:
            if r not in seen:
                seen.add(r)
                firsts.append(offset_of[r])
        assert firsts == sorted(firsts), f"partition {p}: records reordered"
    assert sum(len(v) for v in source.values()) == len(sent)
