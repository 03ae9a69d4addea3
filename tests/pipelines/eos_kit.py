"""What the exactly-once tests share (tests/pipelines/test_mirror_exactly_once.py and
test_standalone_cluster.py): a producer writing unique values in a thread, consumer group members
in threads, the checkpoint's progress, a deadline on a running mirror, and the audit of a
destination's log as read_committed is specified (transaction markers applied by hand: Tansu's
read_committed consumers return aborted records too)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from integration.txn_log import read_log, resolve
from testkit.produce import send_all


def audit(dest: str, topic: str, partitions: int) -> dict[int, Counter[bytes]]:
    """Each destination partition's records as read_committed must see them (the log resolved
    by hand); nothing may be left in an open transaction."""
    out = {}
    for p in range(partitions):
        resolved = resolve(read_log(dest, topic, p))
        assert not resolved.still_open, f"{topic}-{p}: records in a transaction never ended"
        out[p] = Counter(resolved.committed)
    return out


class Writer:
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


def committed_batches(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return len([f for f in folder.iterdir() if f.name.isdigit()]) if folder.exists() else 0


def drained(checkpoint: Path, topic: str, ends: dict[int, int]) -> bool:
    """Whether the last micro-batch the checkpoint committed ends at `ends` (partition ->
    offset)."""
    commits = sorted(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
    if not commits:
        return False
    offsets = (checkpoint / "offsets" / str(commits[-1])).read_text().splitlines()[-1]
    return {int(p): o for p, o in json.loads(offsets)[topic].items()} == ends


def wait(proc: subprocess.Popen[str], done: Any, what: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the mirror exited {proc.returncode}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"not {what} within {seconds} s"
        time.sleep(0.1)


class Group:
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


def committed_in_log(dest: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
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
