"""Producers for bench/coalesce.py and bench/hotpath.py: `python _coalesce_load.py 'JSON'`.

Runs `producers` confluent-kafka Producer instances (one librdkafka client each, so each has its
own broker connections) in one process, one thread per producer. Kept free of project imports
so the process's start-up and CPU use are just the clients'.

Arguments (JSON): bootstrap, topic, producers, first_index, seconds, size, client_prefix,
config (extra librdkafka settings, optional), go_timeout, and either
- rate (msgs/s per producer): paced, as below; or
- closed_loop: true: each producer produces a record only once the previous one's delivery
  report is in (one Produce request per record, one in flight per producer), for `seconds`,
  after `warm_up_s` seconds of the same untimed. Its records are numbered
  (`_workload.sequenced_record`) so `_workload.py verify-sequences` can check the topic, and
  the result adds each producer's records sent and the sequence numbers that failed;
- mixed: true (optional): producer i gets `mixed_config(i)` (acks, idempotence, compression).

Protocol on stdin/stdout, so the parent can take its measurements around exactly the paced
phase of every worker at once:

1. each producer connects and delivers a few warm-up records (metadata, connections), then
   waits for a fresh librdkafka statistics snapshot (the baseline of its request counters);
2. the worker prints `READY` and waits for a line `GO` on stdin (at most go_timeout s);
3. each producer sends rate x seconds records at a steady pace (random phase), polling for
   delivery reports while it waits, then flushes (or runs its closed loop); the worker prints
   `FINISHED`;
4. each producer waits for one more statistics snapshot, and the worker prints one JSON object:
   delivered and failed records, every delivery-report latency in microseconds, Produce
   requests the clients sent in the paced phase (librdkafka `brokers[*].req.Produce`, summed
   over the broker connections), start/end times on the system-wide monotonic clock, and the
   worker's CPU seconds in the paced phase.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import threading
import time
from typing import Any

from _workload import sequenced_record
from confluent_kafka import Producer

WARM_UP_RECORDS = 3
STATS_INTERVAL_MS = 1000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def mixed_config(index: int) -> dict[str, Any]:
    """Producer `index`'s settings in a mixed fleet: acks alternates between 1 and all, every
    acks=all producer is idempotent, and the compression codec cycles through Kafka's five."""
    conf: dict[str, Any] = {"compression.type": CODECS[index % len(CODECS)]}
    if index % 2:
        conf.update({"acks": "all", "enable.idempotence": True})
    else:
        conf["acks"] = "1"
    return conf


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Client:
    """One producer, its delivery-report latencies and its latest statistics."""

    def __init__(self, a: dict[str, Any], index: int) -> None:
        self.index = index
        self.latencies_us: list[int] = []
        self.errors: list[str] = []
        self.sent = 0
        self.failed: list[int] = []
        self.delivered = 0
        self.last_delivery = 0.0
        self._stats: str | None = None
        self._stats_seq = 0
        self._lock = threading.Lock()
        conf: dict[str, Any] = {
            "bootstrap.servers": a["bootstrap"],
            "client.id": f"{a['client_prefix']}-{index}",
            "linger.ms": 0,
            "acks": "all",
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": self._on_stats,
            "on_delivery": self._on_delivery,
        }
        conf.update(a.get("config") or {})
        if a.get("mixed"):
            conf.update(mixed_config(index))
        self.producer = Producer(conf)
        self.topic: str = a["topic"]
        self.value = b"x" * int(a["size"])

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.delivered += 1
        self.latencies_us.append(round(msg.latency() * 1e6))
        self.last_delivery = time.monotonic()

    def _on_stats(self, stats: str) -> None:
        with self._lock:
            self._stats = stats
            self._stats_seq += 1

    def warm_up(self) -> None:
        for _ in range(WARM_UP_RECORDS):
            self.producer.produce(self.topic, self.value)
        if self.producer.flush(30) != 0:
            raise RuntimeError("warm-up records were not delivered within 30 s")
        if self.errors:
            raise RuntimeError(f"warm-up delivery failed: {self.errors[0]}")
        self.latencies_us.clear()
        self.delivered = 0

    def fresh_stats(self, timeout: float = 5.0) -> int:
        """Produce requests sent so far, from a statistics snapshot taken after this call."""
        with self._lock:
            seq = self._stats_seq
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.producer.poll(0.05)
            with self._lock:
                if self._stats_seq > seq and self._stats is not None:
                    return _produce_requests(json.loads(self._stats))
        raise RuntimeError(f"no librdkafka statistics within {timeout} s")

    def run(self, start: float, rate: float, count: int, deadline: float) -> None:
        interval = 1.0 / rate
        phase = random.random() * interval
        p = self.producer
        for i in range(count):
            due = start + phase + i * interval
            while (now := time.monotonic()) < due:
                p.poll(due - now)
            if now > deadline:
                break
            try:
                p.produce(self.topic, self.value)
            except BufferError:
                p.poll(0.01)
                continue
            p.poll(0)
        if p.flush(30) != 0:
            self.errors.append("records still undelivered 30 s after the last produce")

    def run_closed_loop(self, deadline: float, sequenced: bool = True) -> None:
        """Produce records one at a time, each after the previous one's delivery report."""
        p = self.producer
        seq = 0
        while time.monotonic() < deadline:
            delivered, errors = self.delivered, len(self.errors)
            if sequenced:
                key, value = sequenced_record(self.index, seq, len(self.value))
                p.produce(self.topic, value, key)
            else:
                p.produce(self.topic, self.value)
            while self.delivered == delivered and len(self.errors) == errors:
                p.poll(1.0)
            if len(self.errors) > errors:
                self.failed.append(seq)
            seq += 1
        self.sent = seq

    def warm_up_closed_loop(self, seconds: float) -> None:
        """An untimed closed loop of unnumbered records; its counts are then forgotten."""
        self.run_closed_loop(time.monotonic() + seconds, sequenced=False)
        if self.errors:
            raise RuntimeError(f"warm-up delivery failed: {self.errors[0]}")
        self.latencies_us.clear()
        self.delivered = self.sent = 0
        self.failed.clear()


def _produce_requests(stats: dict[str, Any]) -> int:
    return sum(int(b.get("req", {}).get("Produce", 0)) for b in stats.get("brokers", {}).values())


def _in_threads(clients: list[Client], fn_name: str, *args: Any) -> list[Any]:
    results: list[Any] = [None] * len(clients)
    failures: list[BaseException] = []

    def call(i: int, c: Client) -> None:
        try:
            results[i] = getattr(c, fn_name)(*args)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return results


def main(argv: list[str]) -> int:
    a: dict[str, Any] = json.loads(argv[1])
    clients = [Client(a, int(a["first_index"]) + i) for i in range(int(a["producers"]))]
    closed_loop = bool(a.get("closed_loop"))
    _in_threads(clients, "warm_up")
    if closed_loop and a.get("warm_up_s"):
        _in_threads(clients, "warm_up_closed_loop", float(a["warm_up_s"]))
    base = _in_threads(clients, "fresh_stats")
    print("READY", flush=True)
    line = _read_line(float(a.get("go_timeout", 120)))
    if line != "GO":
        raise RuntimeError(f"expected GO on stdin, got {line!r}")
    seconds = float(a["seconds"])
    count = 0 if closed_loop else round(float(a["rate"]) * seconds)
    cpu0 = _cpu()
    start = time.monotonic()
    if closed_loop:
        _in_threads(clients, "run_closed_loop", start + seconds)
    else:
        _in_threads(clients, "run", start, float(a["rate"]), count, start + seconds * 1.5 + 5)
    end_produce = time.monotonic()
    cpu = _cpu() - cpu0
    print("FINISHED", flush=True)
    after = _in_threads(clients, "fresh_stats")
    latencies = [v for c in clients for v in c.latencies_us]
    errors = [e for c in clients for e in c.errors]
    result = {
        "producers": len(clients),
        "offered": sum(c.sent for c in clients) if closed_loop else count * len(clients),
        "delivered": sum(c.delivered for c in clients),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "client_produce_requests": sum(after) - sum(base),
        "start": start,
        "end": max([end_produce, *(c.last_delivery for c in clients)]),
        "cpu_s": cpu,
        "latencies_us": latencies,
        "sequences": {str(c.index): [c.sent, c.failed] for c in clients} if closed_loop else {},
    }
    print(json.dumps(result), flush=True)
    return 0


def _read_line(timeout: float) -> str:
    box: list[str] = []

    def read() -> None:
        box.append(sys.stdin.readline().strip())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise RuntimeError(f"no GO on stdin within {timeout} s")
    return box[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
