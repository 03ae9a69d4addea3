"""Workloads of the lake benchmark, one per process: `python _lake_load.py COMMAND 'JSON'`.

Commands
  load      {"bootstrap", "topic", "partitions", "records", "first_id"}: JSON order records of
            about 200 B, zstd-compressed by confluent-kafka
  baseline  {"bootstrap", "topics", "records", "out"}: what a hand-written ingestion consumer
            does: consume with confluent-kafka (read_committed), json.loads each value, build
            Arrow tables with pyarrow and write zstd Parquet per topic and date
  logsize   {"bootstrap", "topics"}: bytes of record batches in the topics' logs (what Kafka
            stores), read through kipside's reader
"""

from __future__ import annotations

import json
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _consumers import from_the_start
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

# The table's columns: the schema file bench/lake.py gives `kipside lake` says the same.
ITEM = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
VALUE = pa.schema(
    [
        ("id", pa.int64()),
        ("user", pa.string()),
        ("amount", pa.float64()),
        ("paid", pa.bool_()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("status", pa.string()),
        ("items", pa.list_(ITEM)),
        ("note", pa.string()),
    ]
)
JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "status": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
        "note": {"type": "string"},
    },
    "required": ["id"],
}
WORDS = ("alpha", "beta", "gamma", "delta", "card", "euro", "refund", "gift", "express")
STATUS = ("placed", "paid", "shipped", "delivered")


def _value(rng: random.Random, n: int) -> bytes:
    items = ",".join(
        f'{{"sku":"SKU-{rng.randrange(100_000):05d}","qty":{rng.randrange(1, 9)}}}'
        for _ in range(rng.randrange(1, 4))
    )
    note = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))
    return (
        f'{{"id":{n},"user":"user-{rng.randrange(1_000_000)}",'
        f'"amount":{rng.randrange(100, 999_999) / 100},"paid":{"true" if n % 3 else "false"},'
        f'"at":"2026-11-{1 + n % 28:02d}T{n % 24:02d}:{n % 60:02d}:{n % 59:02d}.{n % 1000:03d}Z",'
        f'"status":"{STATUS[n % 4]}","items":[{items}],"note":"{note}"}}'
    ).encode()


def load(a: dict[str, Any]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": a["bootstrap"]})
    partitions = int(a["partitions"])
    topic = a["topic"]
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(timeout=30)
    producer = Producer(
        {
            "bootstrap.servers": a["bootstrap"],
            "compression.type": "zstd",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512_000,
        }
    )
    rng = random.Random(int(a["first_id"]))
    written = 0
    first, last = int(a["first_id"]), int(a["first_id"]) + int(a["records"])
    for n in range(first, last):
        value = _value(rng, n)
        while True:
            try:
                producer.produce(topic, value=value, key=b"order-%d" % n, partition=n % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        written += len(value)
        if n % 20_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise SystemExit(f"load: {topic} not fully delivered")
    return {"records": last - first, "bytes": written}


class _Tables:
    """Rows gathered per (topic, date) and written as zstd Parquet files of up to `rows` rows."""

    def __init__(self, out: Path, rows: int) -> None:
        self.out = out
        self.rows = rows
        self.pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.files = 0

    def add(self, topic: str, date: str, row: dict[str, Any]) -> None:
        rows = self.pending.setdefault((topic, date), [])
        rows.append(row)
        if len(rows) >= self.rows:
            self.flush(topic, date)

    def flush(self, topic: str, date: str) -> None:
        rows = self.pending.pop((topic, date), [])
        if not rows:
            return
        for row in rows:
            row["at"] = datetime.fromisoformat(row["at"]) if row.get("at") else None
        table = pa.Table.from_pylist(rows, schema=VALUE)
        where = self.out / f"topic={topic}" / f"date={date}"
        where.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, where / f"part-{self.files:05d}.parquet", compression="zstd")
        self.files += 1

    def close(self) -> None:
        for topic, date in list(self.pending):
            self.flush(topic, date)


def baseline(a: dict[str, Any]) -> dict[str, Any]:
    consumer = from_the_start(a["bootstrap"], "bench-lake-baseline", a["topics"])
    tables = _Tables(Path(a["out"]), 500_000)
    wanted, seen, bad = int(a["records"]), 0, 0
    started = time.monotonic()
    while seen < wanted:
        if time.monotonic() - started > 1800:
            raise SystemExit(f"baseline: only {seen}/{wanted} records after 30 min")
        for m in consumer.consume(num_messages=10_000, timeout=1.0):
            if m.error() is not None:
                continue
            seen += 1
            try:
                row = json.loads(m.value())
            except (TypeError, ValueError):
                bad += 1
                continue
            ms = m.timestamp()[1]
            date = datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()
            tables.add(m.topic(), date, row)
    tables.close()
    consumer.close()
    return {"records": seen, "bad": bad, "files": tables.files}


def logsize(a: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
    from kipside.pipeline.kafka.connection import Address
    from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
    from kipside.pipeline.kafka.offsets import EARLIEST, list_offsets, watermarks

    address = Address.parse(a["bootstrap"], what="bootstrap")
    with KafkaClient([address], role="bench cluster", config=ClientConfig()) as client:
        meta = client.metadata(list(a["topics"]))
        tps = [(t.name, p) for t in meta.topics.values() for p in t.partitions]
        starts = list_offsets(client, {tp: EARLIEST for tp in tps})
        marks = watermarks(client, starts)
        reader = RangeReader(client, FetchConfig(committed_only=False))
        size = sum(
            batch.size
            for tp in tps
            for batch in reader.read(*tp, starts[tp], marks[tp].high_watermark)
        )
    return {"bytes": size}


COMMANDS = {"load": load, "baseline": baseline, "logsize": logsize}

if __name__ == "__main__":
    result = COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps(result), flush=True)
