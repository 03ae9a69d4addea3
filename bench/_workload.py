"""Client loads of the benchmarks, one process each: `python _workload.py COMMAND 'JSON'`.

confluent-kafka clients; prints one JSON object. Free of project imports, so the process's
start-up and CPU are just the client's. Commands: `create-topics` (and wait until the metadata
shows them); `produce`, producers (one librdkafka client and one thread each) that connect and
warm up, print READY, wait for GO on stdin, run, print FINISHED, then the numbers of that
window, in one of three modes: `paced` (`rate` records/s each), `closed` (one numbered record in
flight each, see `sequenced_record`) or `flood` (as fast as the client takes them); `consume`, a
fresh consumer assigned to every partition from the beginning; `verify-sequences`, which reads
a whole topic and checks that every acknowledged numbered record is there exactly once, in
order within its partition.
"""

from __future__ import annotations

import json
import random
import resource
import select
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

SEQUENCED = b"seq"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# librdkafka pauses fetching for fetch.queue.backoff.ms (default 1000 ms) whenever its queue is
# full, so by default the *faster* path would measure slower. Back off briefly instead.
CONSUMER = {"enable.auto.commit": False, "fetch.queue.backoff.ms": 5}


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def create_topics(a: dict[str, Any]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": a["bootstrap"], **a.get("client", {})})
    topics, partitions = list(a["topics"]), int(a["partitions"])
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=10).topics
        if all(t in listed and len(listed[t].partitions) == partitions for t in topics):
            return {"topics": topics}
        time.sleep(0.05)
    raise RuntimeError(f"topics {topics} did not all appear in metadata")


def sequenced_record(producer: int, seq: int, size: int) -> tuple[bytes, bytes]:
    """Key and value of record `seq` of `producer`: the value, padded to `size` bytes, names
    both; the key spreads one producer's records over the partitions."""
    return b"%d-%d" % (producer, seq), (b"%s %d %d " % (SEQUENCED, producer, seq)).ljust(size, b".")


def mixed_config(index: int) -> dict[str, Any]:
    """acks alternates 1 / all, every acks=all producer is idempotent, codecs cycle."""
    conf: dict[str, Any] = {"compression.type": CODECS[index % len(CODECS)], "acks": "1"}
    return {**conf, "acks": "all", "enable.idempotence": True} if index % 2 else conf


class Client:
    """One producer, its delivery latencies and its latest statistics."""

    def __init__(self, a: dict[str, Any], index: int) -> None:
        self.a, self.index, self.sent, self.delivered, self.last = a, index, 0, 0, 0.0
        self.latencies_us: list[int] = []
        self.errors: list[str] = []
        self.failed: list[int] = []
        self.stats: list[str] = []
        self.capped = False
        conf: dict[str, Any] = {"bootstrap.servers": a["bootstrap"], "acks": "all"}
        conf |= {"client.id": f"{a['client_prefix']}-{index}", "linger.ms": a.get("linger_ms", 0)}
        conf |= {"statistics.interval.ms": 1000, "stats_cb": self.stats.append}
        conf |= {"on_delivery": self._on_delivery, **a.get("client", {})}
        self.producer = Producer({**conf, **(mixed_config(index) if a.get("mixed") else {})})
        self.topic, self.value = a["topic"], b"x" * int(a["size"])

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.delivered += 1
        self.latencies_us.append(round(msg.latency() * 1e6))
        self.last = time.monotonic()

    def warm_up(self) -> None:
        """Connections and metadata before the clock starts (and a closed loop's warm-up)."""
        for _ in range(3):
            self.producer.produce(self.topic, self.value)
        if self.producer.flush(30) != 0:
            raise RuntimeError("warm-up records were not delivered within 30 s")
        if self.a["mode"] == "closed" and self.a.get("warm_up_s"):
            self.closed(time.monotonic() + float(self.a["warm_up_s"]), sequenced=False)
        if self.errors:
            raise RuntimeError(f"warm-up delivery failed: {self.errors[0]}")
        self.latencies_us.clear()
        self.failed.clear()
        self.delivered = self.sent = 0

    def requests(self) -> int:
        """Produce requests sent so far, from a statistics snapshot taken after this call."""
        seen, deadline = len(self.stats), time.monotonic() + 5
        while len(self.stats) == seen and time.monotonic() < deadline:
            self.producer.poll(0.05)
        if len(self.stats) == seen:
            raise RuntimeError("no librdkafka statistics within 5 s")
        brokers = json.loads(self.stats[-1]).get("brokers", {}).values()
        return sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)

    def run(self, start: float) -> None:
        seconds = float(self.a["seconds"])
        if self.a["mode"] == "closed":
            self.closed(start + seconds)
        elif self.a["mode"] == "paced":
            rate = float(self.a["rate"])
            self.paced(start, rate, round(rate * seconds), start + seconds * 1.5 + 5)
        else:
            self.flood(int(self.a["messages"]), start + seconds)
        if self.producer.flush(60) != 0:
            self.errors.append("records still undelivered 60 s after the last produce")

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
        self.sent = count

    def closed(self, deadline: float, sequenced: bool = True) -> None:
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

    def flood(self, total: int, deadline: float) -> None:
        produce, poll, topic, value = (
            self.producer.produce,
            self.producer.poll,
            self.topic,
            self.value,
        )
        while self.sent < total:
            try:
                produce(topic, value)
            except BufferError:
                poll(0.0005)
                continue
            self.sent += 1
            if self.sent % 1000 == 0:
                poll(0)
                if self.sent % 20000 == 0 and time.monotonic() > deadline:
                    self.capped = True
                    break


def each(clients: list[Client], call: Callable[[Client], Any]) -> list[Any]:
    """call(client) for every client, one thread each; the first failure is raised."""
    with ThreadPoolExecutor(len(clients)) as pool:
        return list(pool.map(call, clients))


def read_go(timeout: float) -> None:
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if (line := sys.stdin.readline().strip() if ready else "nothing") != "GO":
        raise RuntimeError(f"expected GO on stdin within {timeout} s, got {line!r}")


def produce(a: dict[str, Any]) -> dict[str, Any]:
    """Warm up, print READY; on GO run every producer; print FINISHED, then the window's
    numbers (Produce requests: librdkafka's `brokers[*].req`)."""
    clients = [Client(a, int(a["first_index"]) + i) for i in range(int(a["producers"]))]
    each(clients, Client.warm_up)
    before = each(clients, Client.requests)
    print("READY", flush=True)
    read_go(float(a["go_timeout"]))
    cpu0, start = cpu_seconds(), time.monotonic()
    each(clients, lambda c: c.run(start))
    end, cpu = time.monotonic(), cpu_seconds() - cpu0
    print("FINISHED", flush=True)
    after = each(clients, Client.requests)
    errors = [e for c in clients for e in c.errors]
    return {
        "offered": sum(c.sent for c in clients),
        "delivered": sum(c.delivered for c in clients),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "capped": any(c.capped for c in clients),
        "client_produce_requests": sum(after) - sum(before),
        "start": start,
        "end": max([end, *(c.last for c in clients)]),
        "cpu_s": cpu,
        "latencies_us": [v for c in clients for v in c.latencies_us],
        "sequences": {str(c.index): [c.sent, c.failed] for c in clients},
    }


def assigned(a: dict[str, Any], **config: Any) -> tuple[Consumer, int]:
    """A consumer assigned to every partition of `topic` from the beginning; and how many."""
    bootstrap, topic, client = a["bootstrap"], a["topic"], a.get("client", {})
    conf = {"bootstrap.servers": bootstrap, "group.id": "kipside-bench", **CONSUMER, **client}
    c = Consumer({**conf, **config})
    md = c.list_topics(topic, timeout=30).topics[topic]
    if md.error is not None:
        raise KafkaException(md.error)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
    return c, len(md.partitions)


def consume(a: dict[str, Any]) -> dict[str, Any]:
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    c, _ = assigned(a)
    deadline, count, size, capped = t0 + float(a["seconds"]), 0, 0, False
    while count < int(a["messages"]):
        if (now := time.perf_counter()) > deadline:
            capped = True
            break
        for msg in c.consume(10000, timeout=min(1.0, deadline - now)):
            if (err := msg.error()) is not None:
                raise KafkaException(err)
            count, size = count + 1, size + len(msg.value() or b"")
    elapsed = time.perf_counter() - t0
    c.close()
    out = {"messages": count, "msgs_per_s": count / elapsed, "mb_per_s": size / elapsed / 1e6}
    return out | {"capped": capped, "cpu_s": cpu_seconds() - cpu0}


def verify_sequences(a: dict[str, Any]) -> dict[str, Any]:
    c, partitions = assigned(a, **{"enable.partition.eof": True})
    seen: Counter[tuple[int, int]] = Counter()
    last: dict[tuple[int, int], int] = {}
    out_of_order, at_end = 0, set[int]()
    deadline = time.perf_counter() + float(a["seconds"])
    while len(at_end) < partitions:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{partitions - len(at_end)} partitions not read in time")
        for msg in c.consume(10000, timeout=1.0):
            err, partition, value = (msg.error(), int(msg.partition() or 0), msg.value() or b"")
            if err is not None and err.name() == "_PARTITION_EOF":
                at_end.add(partition)
            elif err is not None:
                raise KafkaException(err)
            elif value.startswith(SEQUENCED + b" "):  # not a warm-up record
                _, producer, seq, _ = value.split(b" ", 3)
                found = (int(producer), int(seq))
                seen[found] += 1
                where = (partition, found[0])
                out_of_order += where in last and found[1] <= last[where]
                last[where] = found[1]
    c.close()
    acked = {
        (int(producer), seq)
        for producer, (sent, failed) in a["sent"].items()
        for seq in set(range(int(sent))) - set(failed)
    }
    return {
        "duplicates": sum(n - 1 for n in seen.values()),
        "missing": len(acked - seen.keys()),
        "out_of_order": out_of_order,
        "unacknowledged_present": len(seen.keys() - acked),
    }


COMMANDS = {
    "create-topics": create_topics,
    "produce": produce,
    "consume": consume,
    "verify-sequences": verify_sequences,
}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))), flush=True)
