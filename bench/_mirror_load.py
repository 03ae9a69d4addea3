"""Workloads of the mirror benchmark, one per process: `python _mirror_load.py COMMAND 'JSON'`.

Only confluent-kafka (librdkafka): the deep mirror must be what a MirrorMaker-style copier
does, decode every record and produce it again with recompression, and nothing of kipside.

Commands
  load  {"bootstrap", "topics": {topic: codec}, "partitions", "bytes", "size"}: JSON-like
        records of about `size` bytes until `bytes` of record values are written
  deep  {"source", "dest", "topics": {topic: codec}, "records"}: consume every partition from
        the beginning (read_committed) and produce each record to the same topic and
        partition on `dest`, compressed with the topic's codec, until `records` are copied
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from _consumers import from_the_start
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "order",
    "payment",
    "refund",
    "shipped",
    "pending",
    "card",
    "euro",
    "dollar",
]


def _json_record(rng: random.Random, n: int, size: int) -> bytes:
    items = [
        {
            "sku": f"SKU-{rng.randrange(10_000):05d}",
            "qty": rng.randrange(1, 9),
            "price": rng.randrange(100, 99_999) / 100,
        }
        for _ in range(rng.randrange(1, 6))
    ]
    note = " ".join(rng.choice(WORDS) for _ in range(12))
    body = {
        "id": n,
        "user": f"user-{rng.randrange(100_000)}",
        "ts": 1_700_000_000_000 + n,
        "status": rng.choice(WORDS[5:9]),
        "items": items,
        "note": note,
    }
    raw = json.dumps(body, separators=(",", ":"))
    pad = max(0, size - len(raw) - 10)
    return (raw[:-1] + f',"pad":"{"x" * pad}"}}').encode() if pad else raw.encode()


def load(a: dict[str, Any]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
    topics: dict[str, str] = a["topics"]
    partitions = int(a["partitions"])
    for fut in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        fut.result(timeout=30)
    rng = random.Random(7)
    per_topic = int(a["bytes"]) // len(topics)
    written = records = 0
    for topic, codec in topics.items():
        producer = Producer(
            {
                "bootstrap.servers": a["bootstrap"],
                "compression.type": codec,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.kbytes": 512_000,
            }
        )
        done = 0
        n = 0
        while done < per_topic:
            value = _json_record(rng, n, int(a["size"]))
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=f"user-{n % 5000}".encode(),
                        partition=n % partitions,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            done += len(value)
            n += 1
            if n % 20_000 == 0:
                producer.poll(0)
        if producer.flush(120) != 0:
            raise SystemExit(f"load: {topic} not fully delivered")
        written += done
        records += n
    return {"bytes": written, "records": records}


def deep(a: dict[str, Any]) -> dict[str, Any]:
    topics: dict[str, str] = a["topics"]
    consumer = from_the_start(a["source"], "bench-deep-mirror", topics)
    producers = {
        t: Producer(
            {
                "bootstrap.servers": a["dest"],
                "compression.type": codec,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.kbytes": 512_000,
                "enable.idempotence": True,
            }
        )
        for t, codec in topics.items()
    }
    wanted = int(a["records"])
    copied = 0
    started = time.monotonic()
    while copied < wanted:
        if time.monotonic() - started > 1800:
            raise SystemExit(f"deep: only {copied}/{wanted} records after 30 min")
        for m in consumer.consume(num_messages=10_000, timeout=1.0):
            if m.error() is not None:
                continue
            producer = producers[m.topic()]
            while True:
                try:
                    producer.produce(
                        m.topic(),
                        value=m.value(),
                        key=m.key(),
                        headers=m.headers(),
                        timestamp=m.timestamp()[1],
                        partition=m.partition(),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            copied += 1
        for producer in producers.values():
            producer.poll(0)
    for producer in producers.values():
        if producer.flush(300) != 0:
            raise SystemExit("deep: not everything was delivered")
    consumer.close()
    return {"records": copied}


COMMANDS = {"load": load, "deep": deep}

if __name__ == "__main__":
    result = COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps(result), flush=True)
