"""Client workloads for the benchmarks, one per process: `python _workload.py COMMAND 'JSON'`.

Runs confluent-kafka (librdkafka) against a bootstrap address and prints one JSON object on
stdout. Kept free of project imports so the worker's start-up and CPU use are just the client's.

Commands
  create-topics {"bootstrap", "topics", "partitions"}
  produce       {"bootstrap", "topic", "messages", "seconds", "size", "linger_ms", "acks",
                 "config"?}: as fast as possible; throughput and delivery-report latency
  probe         {"bootstrap", "topic", "messages", "rate", "size", "linger_ms", "acks",
                 "config"?}: paced at `rate` msgs/s; latency without queueing
  consume       {"bootstrap", "topic", "messages", "seconds", "config"?}: a fresh consumer
                 assigned to every partition from the beginning until `messages` are read
  verify-sequences {"bootstrap", "topic", "sent", "seconds"}: reads the whole topic and checks
                 the numbered records of closed-loop producers (`sequenced_record`): `sent` maps
                 each producer's index to [records sent, sequence numbers that failed]; every
                 acknowledged one must be there exactly once, and in order within a partition
"""

from __future__ import annotations

import json
import resource
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
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]


def _percentiles(values: list[float], points: tuple[float, ...]) -> dict[str, float]:
    if not values:
        return {f"p{p:g}": float("nan") for p in points}
    ordered = sorted(values)
    out: dict[str, float] = {}
    for p in points:
        idx = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        out[f"p{p:g}"] = ordered[idx]
    return out


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def create_topics(a: dict[str, Any]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
    topics: list[str] = list(a["topics"])
    partitions = int(a["partitions"])
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    )
    for fut in futures.values():
        fut.result(timeout=30)
    # Wait until the metadata shows every partition of every topic.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=10).topics
        if all(
            t in listed and listed[t].error is None and len(listed[t].partitions) == partitions
            for t in topics
        ):
            return {"topics": topics, "partitions": partitions}
        time.sleep(0.05)
    raise RuntimeError(f"topics {topics} did not all appear in metadata")


def _producer(a: dict[str, Any], latencies: list[float], errors: list[str]) -> Producer:
    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency())

    conf: dict[str, Any] = {
        "bootstrap.servers": a["bootstrap"],
        "linger.ms": a["linger_ms"],
        "acks": a["acks"],
        "on_delivery": on_delivery,
    }
    conf.update(a.get("config") or {})
    return Producer(conf)


def _warm_up(p: Producer, topic: str, value: bytes, lat: list[float], err: list[str]) -> None:
    """Connect and fetch the topic's metadata before the clock starts; then forget it."""
    for _ in range(10):
        p.produce(topic, value)
    if p.flush(30) != 0:
        raise RuntimeError("warm-up messages were not delivered within 30 s")
    if err:
        raise RuntimeError(f"warm-up delivery failed: {err[0]}")
    lat.clear()


def produce(a: dict[str, Any]) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    p = _producer(a, latencies, errors)
    topic: str = a["topic"]
    value = b"x" * int(a["size"])
    _warm_up(p, topic, value, latencies, errors)
    total = int(a["messages"])
    limit = float(a["seconds"])
    cpu0 = _cpu()
    t0 = time.perf_counter()
    deadline = t0 + limit
    sent = 0
    capped = False
    produce_ = p.produce
    poll = p.poll
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
    remaining = p.flush(60)
    t1 = time.perf_counter()
    if remaining:
        raise RuntimeError(f"{remaining} messages still undelivered 60 s after the last produce")
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    elapsed = t1 - t0
    pct = _percentiles(latencies, (50, 99))
    return {
        "messages": len(latencies),
        "bytes": len(latencies) * len(value),
        "elapsed_s": elapsed,
        "msgs_per_s": len(latencies) / elapsed,
        "mb_per_s": len(latencies) * len(value) / elapsed / 1e6,
        "latency_p50_ms": pct["p50"] * 1000,
        "latency_p99_ms": pct["p99"] * 1000,
        "time_capped": capped,
        "client_cpu_s": _cpu() - cpu0,
    }


def probe(a: dict[str, Any]) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    p = _producer(a, latencies, errors)
    topic: str = a["topic"]
    value = b"x" * int(a["size"])
    _warm_up(p, topic, value, latencies, errors)
    total = int(a["messages"])
    interval = 1.0 / float(a["rate"])
    t0 = time.perf_counter()
    for i in range(total):
        due = t0 + i * interval
        while (now := time.perf_counter()) < due:
            p.poll(due - now)
        p.produce(topic, value)
        p.poll(0)
    if p.flush(30) != 0:
        raise RuntimeError("probe messages were not delivered within 30 s")
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    pct = _percentiles(latencies, (50, 90, 99))
    return {
        "messages": len(latencies),
        "latency_p50_ms": pct["p50"] * 1000,
        "latency_p90_ms": pct["p90"] * 1000,
        "latency_p99_ms": pct["p99"] * 1000,
        "elapsed_s": time.perf_counter() - t0,
    }


def consume(a: dict[str, Any]) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": a["bootstrap"],
        "group.id": "kipside-bench",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
    }
    conf.update(a.get("config") or {})
    c = Consumer(conf)
    topic: str = a["topic"]
    md = c.list_topics(topic, timeout=30).topics[topic]
    if md.error is not None:
        raise KafkaException(md.error)
    total = int(a["messages"])
    limit = float(a["seconds"])
    cpu0 = _cpu()
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, pid, OFFSET_BEGINNING) for pid in md.partitions])
    deadline = t0 + limit
    count = 0
    nbytes = 0
    capped = False
    while count < total:
        now = time.perf_counter()
        if now > deadline:
            capped = True
            break
        for msg in c.consume(10000, timeout=min(1.0, deadline - now)):
            err = msg.error()
            if err is not None:
                raise KafkaException(err)
            count += 1
            nbytes += len(msg.value() or b"")
    t1 = time.perf_counter()
    c.close()
    elapsed = t1 - t0
    return {
        "messages": count,
        "bytes": nbytes,
        "elapsed_s": elapsed,
        "msgs_per_s": count / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "time_capped": capped,
        "client_cpu_s": _cpu() - cpu0,
    }


SEQUENCED = b"seq"


def sequenced_record(producer: int, seq: int, size: int) -> tuple[bytes, bytes]:
    """Key and value of record `seq` of producer `producer`; the value, padded to `size` bytes,
    names both, and the key spreads one producer's records over the partitions."""
    value = b"%s %d %d " % (SEQUENCED, producer, seq)
    return b"%d-%d" % (producer, seq), value.ljust(size, b".")


def _sequence_of(value: bytes | None) -> tuple[int, int] | None:
    """(producer, seq) of a numbered record; None for any other (warm-up) record."""
    if not value or not value.startswith(SEQUENCED + b" "):
        return None
    _, producer, seq, _ = value.split(b" ", 3)
    return int(producer), int(seq)


def _read_sequences(c: Consumer, partitions: int, limit: float) -> tuple[Counter[Any], int, int]:
    """Every numbered record up to the end of each partition: (counts of (producer, seq),
    records out of order within their partition and producer, other records)."""
    seen: Counter[tuple[int, int]] = Counter()
    last: dict[tuple[int, int], int] = {}
    out_of_order = others = 0
    at_end: set[int] = set()
    deadline = time.perf_counter() + limit
    while len(at_end) < partitions:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{partitions - len(at_end)} partitions not read within {limit} s")
        for msg in c.consume(10000, timeout=1.0):
            err, partition = msg.error(), int(msg.partition() or 0)
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                raise KafkaException(err)
            found = _sequence_of(msg.value())
            if found is None:
                others += 1
                continue
            seen[found] += 1
            where = (partition, found[0])
            if where in last and found[1] <= last[where]:
                out_of_order += 1
            last[where] = found[1]
    return seen, out_of_order, others


def verify_sequences(a: dict[str, Any]) -> dict[str, Any]:
    c = Consumer(
        {
            "bootstrap.servers": a["bootstrap"],
            "group.id": "kipside-bench-verify",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.queue.backoff.ms": 5,
        }
    )
    topic: str = a["topic"]
    md = c.list_topics(topic, timeout=30).topics[topic]
    if md.error is not None:
        raise KafkaException(md.error)
    c.assign([TopicPartition(topic, pid, OFFSET_BEGINNING) for pid in md.partitions])
    seen, out_of_order, others = _read_sequences(c, len(md.partitions), float(a["seconds"]))
    c.close()
    acked = {
        (int(producer), seq)
        for producer, (sent, failed) in a["sent"].items()
        for seq in set(range(int(sent))) - set(failed)
    }
    return {
        "records": sum(seen.values()),
        "acknowledged": len(acked),
        "duplicates": sum(n - 1 for n in seen.values()),
        "missing": len(acked - seen.keys()),
        "out_of_order": out_of_order,
        "unacknowledged_present": len(seen.keys() - acked),
        "other_records": others,
    }


COMMANDS = {
    "create-topics": create_topics,
    "produce": produce,
    "probe": probe,
    "consume": consume,
    "verify-sequences": verify_sequences,
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print(f"usage: {argv[0]} {{{'|'.join(COMMANDS)}}} 'JSON'", file=sys.stderr)
        return 2
    result = COMMANDS[argv[1]](json.loads(argv[2]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
