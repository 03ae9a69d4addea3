"""Data and baselines of the pipeline benchmarks, one per process: `_data_load.py COMMAND 'JSON'`.

  mirror-load {bootstrap, topics: {topic: codec}, partitions, bytes, size}: JSON-like records of
              about `size` bytes until `bytes` of values are written (bench/mirror.py)
  deep        {source, dest, topics: {topic: codec}, records}: the deep mirror, what a
              MirrorMaker-style copier does: consume every partition from the beginning
              (read_committed), produce each record to the same partition on `dest`, compressed
              with the topic's codec
  lake-load   {bootstrap, topic, partitions, records, first_id}: JSON order records of about
              200 B, zstd (bench/lake.py)
  rows-load   {bootstrap, topic, shape, records, rows}: `orders` (lake-load's) or `readings`
              (sensor readings: numbers, optional fields, microsecond timestamps, a header)
              into one partition, zstd, `rows` records per batch (0: lake-load's batching)
              (bench/columnar.py)
  baseline    {bootstrap, topics, records, out}: a hand-written ingestion consumer: consume,
              json.loads each value, pyarrow tables, zstd Parquet per topic and date
  logsize     {bootstrap, topics}: bytes of record batches in the topics' logs (kipside's reader)

Only confluent-kafka and pyarrow, and nothing of kipside but `logsize`'s reader.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _workload import create_topics
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition

BULK = {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512_000}
WORDS: tuple[str, ...] = ("alpha", "beta", "gamma", "delta", "order", "payment", "refund")
WORDS += ("shipped", "pending", "card", "euro", "dollar")
# The lake's table: bench/lake.py gives `kipside lake` the same columns as a JSON schema.
FIELDS = [("id", pa.int64()), ("user", pa.string()), ("amount", pa.float64()), ("paid", pa.bool_())]
FIELDS += [("at", pa.timestamp("us", tz="UTC")), ("status", pa.string())]
ITEMS = pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64())]))
VALUE = pa.schema([*FIELDS, ("items", ITEMS), ("note", pa.string())])
LAKE_WORDS = ["alpha", "beta", "gamma", "delta", "card", "euro", "refund", "gift", "express"]
FLUSHES: list[Callable[[float], int]] = []
JSON_TYPES = {pa.int64(): "integer", pa.string(): "string", pa.float64(): "number"}
JSON_TYPES |= {pa.bool_(): "boolean"}


def json_schema() -> dict[str, Any]:
    """VALUE as the JSON schema `kipside lake --schema` reads."""
    props: dict[str, Any] = {f.name: {"type": JSON_TYPES.get(f.type, "string")} for f in VALUE}
    props["at"]["format"] = "date-time"
    item = {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}
    props["items"] = {"type": "array", "items": item}
    return {"type": "object", "properties": props, "required": ["id"]}


def producing(bootstrap: str, topic: str, partitions: int, **config: Any) -> Callable[..., None]:
    """Create `topic` and return a produce(value, key, partition) that waits out full queues."""
    create_topics({"bootstrap": bootstrap, "topics": [topic], "partitions": partitions})
    producer = Producer({"bootstrap.servers": bootstrap, **BULK, **config})
    FLUSHES.append(producer.flush)
    return partial(send, producer, topic)


def send(producer: Producer, topic: str, value: Any, key: Any, partition: int, **more: Any) -> None:
    """producer.produce, waiting while its queue is full."""
    while True:
        try:
            return producer.produce(topic, value, key, partition=partition, **more)
        except BufferError:
            producer.poll(0.05)


def flush_all(timeout: float) -> None:
    for flush in FLUSHES:
        if flush(timeout) != 0:
            raise SystemExit("records not delivered in time")


def mirror_load(a: dict[str, Any]) -> dict[str, Any]:
    rng, written, records = random.Random(7), 0, 0
    for topic, codec in a["topics"].items():
        produce = producing(
            a["bootstrap"], topic, int(a["partitions"]), **{"compression.type": codec}
        )
        done = n = 0
        while done < int(a["bytes"]) // len(a["topics"]):
            items = []
            for _ in range(rng.randrange(1, 6)):
                sku, qty = f"SKU-{rng.randrange(10_000):05d}", rng.randrange(1, 9)
                items.append({"sku": sku, "qty": qty, "price": rng.randrange(100, 99_999) / 100})
            body = {"id": n, "user": f"user-{rng.randrange(100_000)}", "ts": 1_700_000_000_000 + n}
            body |= {"status": rng.choice(WORDS[5:9]), "items": items}
            body |= {"note": " ".join(rng.choice(WORDS) for _ in range(12))}
            raw = json.dumps(body, separators=(",", ":"))
            pad = max(0, int(a["size"]) - len(raw) - 10)
            value = (raw[:-1] + f',"pad":"{"x" * pad}"}}').encode() if pad else raw.encode()
            produce(value, f"user-{n % 5000}".encode(), n % int(a["partitions"]))
            done, n = done + len(value), n + 1
        written, records = written + done, records + n
    flush_all(120)
    return {"bytes": written, "records": records}


def from_the_start(bootstrap: str, group: str, topics: list[str]) -> Iterator[Message]:
    """Every record of `topics`, read_committed, from the start of every partition (an
    assigned consumer: no group offsets used or committed), with fetch sizes for bulk reads."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group}
    config |= {"enable.auto.commit": False, "isolation.level": "read_committed"}
    consumer = Consumer(
        {**config, "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 8 << 20}
    )
    meta = consumer.list_topics(timeout=30).topics
    consumer.assign(
        [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
    )
    started = time.monotonic()
    try:
        while time.monotonic() - started < 1800:
            yield from (m for m in consumer.consume(10_000, timeout=1.0) if m.error() is None)
        raise SystemExit("not everything was read in 30 min")
    finally:
        consumer.close()


def deep(a: dict[str, Any]) -> dict[str, Any]:
    dest = {"bootstrap.servers": a["dest"], **BULK, "enable.idempotence": True}
    out = {t: Producer({**dest, "compression.type": c}) for t, c in a["topics"].items()}
    copied = 0
    for m in from_the_start(a["source"], "bench-deep-mirror", list(a["topics"])):
        topic, more = str(m.topic()), {"headers": m.headers(), "timestamp": m.timestamp()[1]}
        send(out[topic], topic, m.value(), m.key(), m.partition() or 0, **more)
        copied += 1
        if copied % 10_000 == 0:
            for p in out.values():
                p.poll(0)
        if copied == int(a["records"]):
            break
    if any(p.flush(300) for p in out.values()):
        raise SystemExit("deep: not everything was delivered")
    return {"records": copied}


def order_value(n: int, rng: random.Random) -> bytes:
    """Order `n` of the lake benchmark: about 200 B of JSON."""
    items = ",".join(
        f'{{"sku":"SKU-{rng.randrange(100_000):05d}","qty":{rng.randrange(1, 9)}}}'
        for _ in range(rng.randrange(1, 4))
    )
    note = " ".join(rng.choice(LAKE_WORDS) for _ in range(rng.randrange(1, 5)))
    at = f"2026-11-{1 + n % 28:02d}T{n % 24:02d}:{n % 60:02d}:{n % 59:02d}.{n % 1000:03d}Z"
    return (
        f'{{"id":{n},"user":"user-{rng.randrange(1_000_000)}","amount":'
        f'{rng.randrange(100, 999_999) / 100},"paid":{"true" if n % 3 else "false"},'
        f'"at":"{at}","status":"{("placed", "paid", "shipped", "delivered")[n % 4]}",'
        f'"items":[{items}],"note":"{note}"}}'
    ).encode()


def lake_load(a: dict[str, Any]) -> dict[str, Any]:
    partitions, first = int(a["partitions"]), int(a["first_id"])
    produce = producing(a["bootstrap"], a["topic"], partitions, **{"compression.type": "zstd"})
    rng, written = random.Random(first), 0
    for n in range(first, first + int(a["records"])):
        value = order_value(n, rng)
        produce(value, b"order-%d" % n, n % partitions)
        written += len(value)
    flush_all(300)
    return {"records": int(a["records"]), "bytes": written}


def reading_value(n: int, rng: random.Random) -> bytes:
    """Reading `n` of a fleet of 500 sensors: numbers, a microsecond timestamp, fields a
    sensor leaves out when it has nothing to say; about 190 B of JSON."""
    device = n % 500
    micros = 1_795_000_000_000_000 + n * 1_003_117
    at = datetime.fromtimestamp(micros / 1e6, UTC).isoformat(timespec="microseconds")
    body: dict[str, Any] = {
        "device": f"dev-{device:04d}",
        "seq": n // 500,
        "at": at.replace("+00:00", "Z"),
        "temperature": round(18 + device % 7 + rng.gauss(0, 0.8), 2),
        "humidity": round(rng.uniform(0.3, 0.7), 4),
        "pressure": round(1013 + rng.gauss(0, 4), 1),
        "battery": max(0, 100 - n // 20_000 - device % 13),
        "firmware": f"4.{device % 3}.{device % 5}",
        "location": {"lat": round(52 + device / 1000, 5), "lon": round(4.3 + device / 700, 5)},
    }
    if rng.random() < 0.1:
        body["alarms"] = [rng.choice(["overheat", "low-battery", "door-open"])]
    if rng.random() < 0.3:
        body["vibration"] = round(abs(rng.gauss(0, 0.05)), 4)
    return json.dumps(body, separators=(",", ":")).encode()


def readings_schema() -> dict[str, Any]:
    """`readings` as the JSON schema a columnar rule names."""
    number, integer, string = {"type": "number"}, {"type": "integer"}, {"type": "string"}
    props: dict[str, Any] = {"device": string, "seq": integer}
    props["at"] = {"type": "string", "format": "date-time"}
    props |= {"temperature": number, "humidity": number, "pressure": number}
    props |= {"battery": integer, "firmware": string, "vibration": number}
    props["location"] = {"type": "object", "properties": {"lat": number, "lon": number}}
    props["alarms"] = {"type": "array", "items": string}
    return {"type": "object", "properties": props, "required": ["device", "at"]}


def rows_load(a: dict[str, Any]) -> dict[str, Any]:
    rows = int(a["rows"])
    # One partition and a linger long enough that every batch fills up to `rows` records
    # (librdkafka's batch.num.messages); 0 keeps lake-load's settings and 4 partitions.
    if rows:
        size = {"batch.num.messages": rows, "linger.ms": 1000}
        size |= {"batch.size": 64 << 20, "message.max.bytes": 64 << 20}
    else:
        size = {}
    partitions = 1 if rows else 4
    produce = producing(
        a["bootstrap"], a["topic"], partitions, **{"compression.type": "zstd", **size}
    )
    value_of = order_value if a["shape"] == "orders" else reading_value
    rng, written = random.Random(int(a.get("seed", 7))), 0
    for n in range(int(a["records"])):
        value = value_of(n, rng)
        if a["shape"] == "orders":
            produce(value, b"order-%d" % n, n % partitions)
        else:
            more = {"headers": [("source", b"gateway-%d" % (n % 3))]}
            produce(value, None, n % partitions, **more)
        written += len(value)
    flush_all(600)
    return {"records": int(a["records"]), "bytes": written}


def baseline(a: dict[str, Any]) -> dict[str, Any]:
    pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
    files, seen = 0, 0

    def write(key: tuple[str, str]) -> None:
        nonlocal files
        rows = pending.pop(key)
        for row in rows:
            row["at"] = datetime.fromisoformat(row["at"]) if row.get("at") else None
        where = Path(a["out"]) / f"topic={key[0]}" / f"date={key[1]}"
        where.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(rows, schema=VALUE)
        pq.write_table(table, where / f"part-{files:05d}.parquet", compression="zstd")
        files += 1

    for m in from_the_start(a["bootstrap"], "bench-lake-baseline", a["topics"]):
        day = datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC).date().isoformat()
        rows = pending.setdefault(key := (str(m.topic()), day), [])
        rows.append(json.loads(m.value() or b"null"))
        if len(rows) >= 500_000:
            write(key)
        seen += 1
        if seen == int(a["records"]):
            break
    for key in list(pending):
        write(key)
    return {"records": seen, "files": files}


def logsize(a: dict[str, Any]) -> dict[str, Any]:
    from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
    from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
    from kipside.pipeline.kafka.offsets import EARLIEST, list_offsets, watermarks
    from kipside.protocol import Address

    address = Address.parse(a["bootstrap"], what="bootstrap")
    with KafkaClient([address], role="bench cluster", config=ClientConfig()) as client:
        meta = client.metadata(list(a["topics"]))
        tps = [(t.name, p) for t in meta.topics.values() for p in t.partitions]
        starts = list_offsets(client, {tp: EARLIEST for tp in tps})
        ends = watermarks(client, starts)
        reader = RangeReader(client, FetchConfig(committed_only=False))
        size = sum(
            b.size for tp in tps for b in reader.read(*tp, starts[tp], ends[tp].high_watermark)
        )
    return {"bytes": size}


COMMANDS = {"mirror-load": mirror_load, "deep": deep, "lake-load": lake_load, "baseline": baseline}
COMMANDS["rows-load"] = rows_load

if __name__ == "__main__":
    print(json.dumps({**COMMANDS, "logsize": logsize}[sys.argv[1]](json.loads(sys.argv[2]))))
