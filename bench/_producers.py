"""Many producers in one process, driven in stages: `python _producers.py 'JSON'`.

`producers` confluent-kafka Producers (one librdkafka client each, so each has its own broker
connections), one thread each. Arguments: bootstrap, topic, producers, first_index, seconds,
size, client_prefix, go_timeout, and either `rate` (records/s per producer, at a steady pace
with a random phase, then a flush) or `closed_loop` (each record produced once the previous
one's delivery report is in: one Produce request per record, one in flight; numbered records,
see _workload.sequenced_record; after `warm_up_s` of the same, untimed). `mixed` gives producer
i `mixed_config(i)`.

Stages: connect and deliver a few warm-up records, wait for a fresh librdkafka statistics
snapshot, print READY; on a line GO from stdin, run; print FINISHED; take one more statistics
snapshot and print one JSON object: delivered and failed records, every delivery latency (us),
the Produce requests the clients sent while running (librdkafka `brokers[*].req.Produce`),
start/end on the system-wide monotonic clock, the process's CPU seconds while running, and for
closed loops each producer's [records sent, sequence numbers that failed].
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from _workload import cpu_seconds, sequenced_record
from confluent_kafka import Producer

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def mixed_config(index: int) -> dict[str, Any]:
    """acks alternates 1 / all, every acks=all producer is idempotent, codecs cycle."""
    conf: dict[str, Any] = {"compression.type": CODECS[index % len(CODECS)], "acks": "1"}
    return {**conf, "acks": "all", "enable.idempotence": True} if index % 2 else conf


class Client:
    """One producer, its delivery latencies and its latest statistics."""

    def __init__(self, a: dict[str, Any], index: int) -> None:
        self.index, self.sent, self.delivered, self.last = index, 0, 0, 0.0
        self.latencies_us: list[int] = []
        self.errors: list[str] = []
        self.failed: list[int] = []
        self.stats: list[str] = []
        conf: dict[str, Any] = {
            "bootstrap.servers": a["bootstrap"],
            "client.id": f"{a['client_prefix']}-{index}",
            "linger.ms": 0,
            "acks": "all",
            "statistics.interval.ms": 1000,
            "stats_cb": self.stats.append,
            "on_delivery": self._on_delivery,
        }
        self.producer = Producer({**conf, **(mixed_config(index) if a.get("mixed") else {})})
        self.topic, self.value = a["topic"], b"x" * int(a["size"])

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.delivered += 1
        self.latencies_us.append(round(msg.latency() * 1e6))
        self.last = time.monotonic()

    def forget(self) -> None:
        if self.errors:
            raise RuntimeError(f"warm-up delivery failed: {self.errors[0]}")
        self.latencies_us.clear()
        self.failed.clear()
        self.delivered = self.sent = 0

    def warm_up(self, seconds: float) -> None:
        for _ in range(3):
            self.producer.produce(self.topic, self.value)
        if self.producer.flush(30) != 0:
            raise RuntimeError("warm-up records were not delivered within 30 s")
        if seconds:
            self.closed_loop(time.monotonic() + seconds, sequenced=False)
        self.forget()

    def requests(self) -> int:
        """Produce requests sent so far, from a statistics snapshot taken after this call."""
        seen, deadline = len(self.stats), time.monotonic() + 5
        while len(self.stats) == seen and time.monotonic() < deadline:
            self.producer.poll(0.05)
        if len(self.stats) == seen:
            raise RuntimeError("no librdkafka statistics within 5 s")
        brokers = json.loads(self.stats[-1]).get("brokers", {}).values()
        return sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)

    def paced(self, start: float, rate: float, count: int, deadline: float) -> None:
        p, phase = self.producer, random.random() / rate
        for i in range(count):
            while (now := time.monotonic()) < (due := start + phase + i / rate):
                p.poll(due - now)
            if now > deadline:
                break
            try:
                p.produce(self.topic, self.value)
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        if p.flush(30) != 0:
            self.errors.append("records still undelivered 30 s after the last produce")

    def closed_loop(self, deadline: float, sequenced: bool = True) -> None:
        p, seq = self.producer, 0
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


def each(clients: list[Client], call: Callable[[Client], Any]) -> list[Any]:
    """call(client) for every client, one thread each; the first failure is raised."""
    results: list[Any] = [None] * len(clients)
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = call(clients[i])
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return results


def read_go(timeout: float) -> None:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(sys.stdin.readline().strip()), daemon=True)
    reader.start()
    reader.join(timeout)
    if box != ["GO"]:
        raise RuntimeError(f"expected GO on stdin within {timeout} s, got {box}")


def main(a: dict[str, Any]) -> dict[str, Any]:
    clients = [Client(a, int(a["first_index"]) + i) for i in range(int(a["producers"]))]
    closed, seconds = bool(a.get("closed_loop")), float(a["seconds"])
    each(clients, lambda c: c.warm_up(float(a.get("warm_up_s", 0)) if closed else 0))
    before = each(clients, Client.requests)
    print("READY", flush=True)
    read_go(float(a.get("go_timeout", 120)))
    count = 0 if closed else round(float(a["rate"]) * seconds)
    cpu0, start = cpu_seconds(), time.monotonic()
    if closed:
        each(clients, lambda c: c.closed_loop(start + seconds))
    else:
        each(clients, lambda c: c.paced(start, float(a["rate"]), count, start + seconds * 1.5 + 5))
    end, cpu = time.monotonic(), cpu_seconds() - cpu0
    print("FINISHED", flush=True)
    after = each(clients, Client.requests)
    errors = [e for c in clients for e in c.errors]
    return {
        "offered": sum(c.sent for c in clients) if closed else count * len(clients),
        "delivered": sum(c.delivered for c in clients),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "client_produce_requests": sum(after) - sum(before),
        "start": start,
        "end": max([end, *(c.last for c in clients)]),
        "cpu_s": cpu,
        "latencies_us": [v for c in clients for v in c.latencies_us],
        "sequences": {str(c.index): [c.sent, c.failed] for c in clients} if closed else {},
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
