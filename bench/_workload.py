"""Client workloads of the benchmarks, one per process: `python _workload.py COMMAND 'JSON'`.

confluent-kafka (librdkafka) against a bootstrap address; prints one JSON object. Free of
project imports, so the process's start-up and CPU are just the client's.

  create-topics {bootstrap, topics, partitions}: and wait until the metadata shows them
  produce  {bootstrap, topic, messages, seconds, size, linger_ms, acks}: as fast as it can
  probe    {bootstrap, topic, messages, rate, size, linger_ms, acks}: paced at `rate` msgs/s,
           so the delivery latency has no queueing in it
  consume  {bootstrap, topic, messages, seconds, config}: a fresh consumer assigned to every
           partition from the beginning until `messages` are read
  verify-sequences {bootstrap, topic, sent, seconds}: read the whole topic and check the
           numbered records of closed-loop producers (`sequenced_record`): `sent` maps each
           producer to [records sent, sequence numbers that failed]; every acknowledged one
           must be there exactly once, in order within its partition
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections import Counter
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

SEQUENCED = b"seq"


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def latency_ms(seconds: list[float]) -> dict[str, float]:
    if len(seconds) < 2:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    cuts = statistics.quantiles(seconds, n=100)
    return {"p50_ms": statistics.median(seconds) * 1000, "p99_ms": cuts[98] * 1000}


def create_topics(a: dict[str, Any]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
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


class Measured:
    """A producer whose delivery reports feed latencies and errors; warmed up on creation
    (connections and metadata before the clock starts)."""

    def __init__(self, a: dict[str, Any]) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        conf = {"bootstrap.servers": a["bootstrap"], "linger.ms": a["linger_ms"], "acks": a["acks"]}
        self.producer = Producer({**conf, "on_delivery": self._delivered})
        self.topic, self.value = a["topic"], b"x" * int(a["size"])
        for _ in range(10):
            self.producer.produce(self.topic, self.value)
        self.flush(30)
        self.latencies.clear()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.latencies.append(msg.latency())

    def flush(self, timeout: float) -> None:
        if (left := self.producer.flush(timeout)) or self.errors:
            raise RuntimeError(f"{left} undelivered after {timeout} s; errors: {self.errors[:1]}")


def produce(a: dict[str, Any]) -> dict[str, Any]:
    m = Measured(a)
    produce_, poll, topic, value = m.producer.produce, m.producer.poll, m.topic, m.value
    total, cpu0, t0 = int(a["messages"]), cpu_seconds(), time.perf_counter()
    deadline, sent, capped = t0 + float(a["seconds"]), 0, False
    while sent < total:
        try:
            produce_(topic, value)
        except BufferError:
            poll(0.0005)
            continue
        sent += 1
        if sent % 1000 == 0:
            poll(0)
            if sent % 20000 == 0 and time.perf_counter() > deadline:
                capped = True
                break
    m.flush(60)
    elapsed, n = time.perf_counter() - t0, len(m.latencies)
    return {
        "messages": n,
        "msgs_per_s": n / elapsed,
        "mb_per_s": n * len(value) / elapsed / 1e6,
        "time_capped": capped,
        "cpu_s": cpu_seconds() - cpu0,
        **latency_ms(m.latencies),
    }


def probe(a: dict[str, Any]) -> dict[str, Any]:
    m = Measured(a)
    interval, t0 = 1.0 / float(a["rate"]), time.perf_counter()
    for i in range(int(a["messages"])):
        while (now := time.perf_counter()) < t0 + i * interval:
            m.producer.poll(t0 + i * interval - now)
        m.producer.produce(m.topic, m.value)
        m.producer.poll(0)
    m.flush(30)
    return {"messages": len(m.latencies), **latency_ms(m.latencies)}


def assigned(bootstrap: str, topic: str, **config: Any) -> tuple[Consumer, int]:
    """A consumer assigned to every partition of `topic` from the beginning; and how many."""
    c = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False, **config})
    md = c.list_topics(topic, timeout=30).topics[topic]
    if md.error is not None:
        raise KafkaException(md.error)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
    return c, len(md.partitions)


def consume(a: dict[str, Any]) -> dict[str, Any]:
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    c, _ = assigned(a["bootstrap"], a["topic"], **{"group.id": "kipside-bench", **a["config"]})
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
    return {
        "messages": count,
        "msgs_per_s": count / elapsed,
        "mb_per_s": size / elapsed / 1e6,
        "time_capped": capped,
        "cpu_s": cpu_seconds() - cpu0,
    }


def sequenced_record(producer: int, seq: int, size: int) -> tuple[bytes, bytes]:
    """Key and value of record `seq` of `producer`: the value, padded to `size` bytes, names
    both; the key spreads one producer's records over the partitions."""
    return b"%d-%d" % (producer, seq), (b"%s %d %d " % (SEQUENCED, producer, seq)).ljust(size, b".")


def verify_sequences(a: dict[str, Any]) -> dict[str, Any]:
    config = {"group.id": "kipside-bench-verify", "enable.partition.eof": True}
    c, partitions = assigned(a["bootstrap"], a["topic"], **config, **{"fetch.queue.backoff.ms": 5})
    seen: Counter[tuple[int, int]] = Counter()
    last: dict[tuple[int, int], int] = {}
    out_of_order, at_end = 0, set[int]()
    deadline = time.perf_counter() + float(a["seconds"])
    while len(at_end) < partitions:
        if time.perf_counter() > deadline:
            raise RuntimeError(
                f"{partitions - len(at_end)} partitions not read in {a['seconds']} s"
            )
        for msg in c.consume(10000, timeout=1.0):
            err, partition, value = msg.error(), int(msg.partition() or 0), msg.value() or b""
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
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
    "probe": probe,
    "consume": consume,
    "verify-sequences": verify_sequences,
}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))), flush=True)
