"""Columnar carriers against zstd record batches: broker log bytes and codec CPU, by rows per batch.

    .venv/bin/python bench/columnar.py [--records 100000] [--rows 10,100,1000,10000]
        [--lake-records 1000000] [--quick]

Two datasets, each written by confluent-kafka (zstd) into one partition per rows-per-batch
setting (librdkafka's batch.num.messages), plus once as bench/lake.py writes it (its producer
settings, 4 partitions): `orders`, the lake benchmark's JSON orders (bench/_data_load.py), and
`readings`, sensor readings (numbers, optional fields, microsecond timestamps, a header, no
key). Every batch Tansu stored is read back with kipside's reader and turned into a carrier by
the encoder the sidecar uses (kipside.protocol.ColumnarEncoder, the values' JSON schema); the
carriers are produced to a second topic by an idempotent producer and read back. Log bytes are
what Tansu returns for each topic (every stored batch, headers included), so both columns are
what the broker stores and serves. Every carrier is decoded again and its records checked
against the stored ones (offsets, timestamps, keys, headers exact; values equal as JSON).

CPU: this process's CPU time (time.process_time) around the encoder over all batches of a
setting, and around the decoder over all carriers (to an ordinary batch: what kipside's Fetch
path does); per MB of JSON values and per record.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from _chart import Panel
from _data_load import json_schema, readings_schema
from _harness import REPO
from _measure import run_json
from _report import Report, Table, Target, facts, listed, parse_args
from testkit.broker import start_tansu

from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
from kipside.pipeline.kafka.offsets import EARLIEST, list_offsets, watermarks
from kipside.pipeline.kafka.producer import IdempotentProducer, Written
from kipside.protocol import (
    Address,
    ColumnarEncoder,
    Encoded,
    RecordBatchView,
    decode_columnar_batch,
    decode_columns,
    parse_json_schema,
    reencode_columnar_batch,
)

LOAD = REPO / "bench" / "_data_load.py"
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--records": (int, 100_000, "records per dataset and setting"),
    "--rows": (listed(int), [10, 100, 1000, 10_000], "rows per batch to measure"),
    "--lake-records": (int, 1_000_000, "records written as bench/lake.py writes them"),
}
SHAPES = {"orders": json_schema(), "readings": readings_schema()}
LAKE = 0  # rows-load's "as bench/lake.py writes it"
TARGET = 0.6


@dataclass(frozen=True)
class Found:
    shape: str
    rows: int
    batches: int
    records: int
    values: int
    zstd_log: int
    carrier_log: int
    verbatim: int
    encode_cpu: float
    decode_cpu: float

    @property
    def ratio(self) -> float:
        return self.carrier_log / self.zstd_log

    @property
    def setting(self) -> str:
        if self.rows:
            return f"{self.rows:,}"
        return f"as bench/lake.py writes (~{self.records / self.batches:,.0f})"


def stored(client: KafkaClient, topic: str) -> list[bytes]:
    """Every batch of `topic` as the broker returns it, partition by partition."""
    tps = [(topic, p) for p in client.metadata([topic]).topics[topic].partitions]
    starts = list_offsets(client, {tp: EARLIEST for tp in tps})
    ends = watermarks(client, starts)
    reader = RangeReader(client, FetchConfig(committed_only=False))
    return [
        bytes(b.raw) for tp in tps for b in reader.read(*tp, starts[tp], ends[tp].high_watermark)
    ]


def records_of(batch: bytes) -> list[tuple[Any, ...]]:
    """(offset, timestamp, key, value as JSON, headers) of each record, by kipside's kernel."""
    columns = decode_columns([RecordBatchView.from_buffer(batch)])
    out = []
    count = 0
    for i in range(len(columns)):
        k, v = columns.key, columns.value
        key = bytes(k.data[k.offsets[i] : k.offsets[i + 1]]) if k.valid[i] else None
        value = json.loads(bytes(v.data[v.offsets[i] : v.offsets[i + 1]]))
        headers = []
        for j in range(count, count + int(columns.header_counts[i])):
            hk, hv = columns.header_key, columns.header_value
            name = bytes(hk.data[hk.offsets[j] : hk.offsets[j + 1]]).decode()
            body = bytes(hv.data[hv.offsets[j] : hv.offsets[j + 1]]) if hv.valid[j] else None
            headers.append((name, body))
        count += int(columns.header_counts[i])
        out.append((int(columns.offset[i]), int(columns.timestamp[i]), key, value, headers))
    return out


def cpu(work: Callable[[], Any]) -> tuple[Any, float]:
    start = time.process_time()
    result = work()
    return result, time.process_time() - start


def measure(client: KafkaClient, boot: str, shape: str, rows: int, records: int) -> Found:
    topic = f"bench-columnar-{shape}-{rows or 'lake'}"
    job = {"bootstrap": boot, "topic": topic, "shape": shape, "records": records, "rows": rows}
    values = int(run_json(LOAD, "rows-load", json.dumps(job), timeout=1800)["bytes"])
    batches = stored(client, topic)
    schema = parse_json_schema(json.dumps(SHAPES[shape]), f"{shape}.json").to_arrow()
    encoder = ColumnarEncoder(schema)
    results, encode_cpu = cpu(lambda: [encoder.encode(b) for b in batches])
    carriers = []
    for result in results:
        if not isinstance(result, Encoded):
            raise SystemExit(f"{topic}: a batch was not encoded: {result}")
        carriers.append(result.batch)
    ordinary, decode_cpu = cpu(lambda: [reencode_columnar_batch(c) for c in carriers])
    for batch, carrier, again in zip(batches, carriers, ordinary, strict=True):
        expected = records_of(batch)
        got = [
            (r.offset, r.timestamp, r.key, json.loads(r.value), list(r.headers))
            for r in decode_columnar_batch(carrier)
        ]
        if got != expected or records_of(again) != expected:
            raise SystemExit(f"{topic}: a carrier did not give back its batch's records")
    carrier_topic = f"{topic}-carrier"
    job = {"bootstrap": boot, "topics": [carrier_topic], "partitions": 1}
    run_json(REPO / "bench" / "_workload.py", "create-topics", json.dumps(job), timeout=60)
    producer: IdempotentProducer[int] = IdempotentProducer(client)
    for i, carrier in enumerate(carriers):
        producer.add(carrier_topic, 0, RecordBatchView.from_buffer(carrier), i)
    acknowledged: list[Written[int]] = []
    producer.flush(acknowledged.extend)
    producer.close()
    carrier_log = sum(len(b) for b in stored(client, carrier_topic))
    if carrier_log != sum(len(c) for c in carriers) or len(acknowledged) != len(carriers):
        raise SystemExit(f"{carrier_topic}: the broker stores other bytes than were produced")
    return Found(
        shape,
        rows,
        len(batches),
        records,
        values,
        sum(len(b) for b in batches),
        carrier_log,
        sum(r.verbatim for r in results if isinstance(r, Encoded)),
        encode_cpu,
        decode_cpu,
    )


def rows_table(found: Sequence[Found]) -> Table:
    headers = ["data", "rows per batch", "batches", "zstd batches MB", "carriers MB"]
    headers += ["carriers / zstd", "values kept whole"]
    rows = [
        [
            f.shape,
            f.setting,
            f"{f.batches:,}",
            f"{f.zstd_log / 1e6:,.2f}",
            f"{f.carrier_log / 1e6:,.2f}",
            f"{f.ratio:.2f}",
            f"{f.verbatim:,}",
        ]
        for f in found
    ]
    return Table("Broker log bytes", headers, rows, "llrrrrr")


def cpu_table(found: Sequence[Found]) -> Table:
    headers = ["data", "rows per batch", "values MB", "encode CPU s per MB", "encode us/record"]
    headers += ["decode CPU s per MB", "decode us/record"]
    rows = [
        [
            f.shape,
            f.setting,
            f"{f.values / 1e6:,.1f}",
            f"{f.encode_cpu / (f.values / 1e6):.3f}",
            f"{f.encode_cpu / f.records * 1e6:.2f}",
            f"{f.decode_cpu / (f.values / 1e6):.3f}",
            f"{f.decode_cpu / f.records * 1e6:.2f}",
        ]
        for f in found
    ]
    return Table("Codec CPU (this process, one thread)", headers, rows, "llrrrrr")


def main() -> int:
    args = parse_args(
        __doc__, OPTIONS, {"records": 20_000, "rows": [10, 1000], "lake_records": 50_000}
    )
    found: list[Found] = []
    with start_tansu() as broker:
        address = Address.parse(broker.bootstrap, what="bootstrap")
        with KafkaClient([address], role="bench cluster", config=ClientConfig()) as client:
            for shape in SHAPES:
                for rows in [*args.rows, LAKE]:
                    records = args.lake_records if rows == LAKE else args.records
                    found.append(measure(client, broker.bootstrap, shape, rows, records))
                    print(rows_table(found[-1:]).markdown(), file=sys.stderr)
    lake = [f for f in found if f.rows == LAKE]
    targets = [
        Target(
            f"{f.shape}: carrier log bytes at most {TARGET}x the zstd batches ({f.setting})",
            f.ratio <= TARGET,
            f"{f.ratio:.2f}x ({f.carrier_log / 1e6:,.2f} MB vs {f.zstd_log / 1e6:,.2f} MB)",
        )
        for f in lake
    ]
    settings = [f"{r:,}" for r in args.rows]
    panels = [
        Panel(
            "carrier bytes / zstd batch bytes",
            [*settings, "lake.py"],
            {shape: [f.ratio for f in found if f.shape == shape] for shape in SHAPES},
            "{:.2f}",
        ),
        Panel(
            "encoder CPU s per MB of values",
            [*settings, "lake.py"],
            {
                shape: [f.encode_cpu / (f.values / 1e6) for f in found if f.shape == shape]
                for shape in SHAPES
            },
            "{:.3f}",
        ),
    ]
    data = (
        f"Data: {args.records:,} records per dataset and rows-per-batch setting, "
        f"{args.lake_records:,} written as bench/lake.py writes them; `orders` "
        f"{found[0].values / found[0].records:.0f} B of JSON on average, `readings` "
        f"{lake[-1].values / lake[-1].records:.0f} B. Log bytes: every stored batch of the "
        "topic as Tansu returns it."
    )
    Report(
        "columnar",
        "Columnar carriers: broker log bytes and codec CPU by rows per batch",
        facts(data, tools=["pyarrow"]),
        [rows_table(found), cpu_table(found)],
        targets,
        chart=("columnar carriers vs zstd record batches", panels),
    ).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
