"""Columnar carriers against zstd record batches: broker log bytes and codec CPU, by rows per batch;
and the sidecar converting them: produce and consume throughput through kipside against direct.

    .venv/bin/python bench/columnar.py [--records 100000] [--rows 10,100,1000,10000]
        [--lake-records 1000000] [--sidecar-records 300000] [--repeats 3]
        [--parts codec,sidecar] [--quick]

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

The sidecar (its own section): per repetition one Tansu with kipside in front, a columnar rule
for `orders-col*` (the orders schema, min_records 100). One confluent-kafka producer process
writes --sidecar-records orders (linger.ms 5, batches of at most 100 records, zstd, 4
partitions) directly to an ordinary topic, through kipside to the columnar topic, and through
kipside to an ordinary topic; then one consumer process reads each back (direct from the
ordinary topic, through kipside from the columnar and the ordinary one). Rates are the
client's own wall time from its first record to its last delivery (or read); CPU is kipside's
and Tansu's process CPU over each step, and the client's. Every read is checked against the
values produced (a digest), and the columnar topic's log must hold carriers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from _chart import Panel
from _data_load import json_schema, readings_schema
from _harness import HOST, REPO, HarnessError, open_stack
from _measure import Run, Window, repeat, run_json
from _report import Report, Table, Target, facts, listed, parse_args
from testkit.broker import start_tansu
from testkit.metrics import scrape

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
    "--sidecar-records": (int, 300_000, "records per producer run through the sidecar"),
    "--repeats": (int, 3, "repetitions of the sidecar runs (median and range)"),
    "--parts": (listed(str, ["codec", "sidecar"]), ["codec", "sidecar"], "what to measure"),
}
SHAPES = {"orders": json_schema(), "readings": readings_schema()}
LAKE = 0  # rows-load's "as bench/lake.py writes it"
TARGET = 0.6
THROUGHPUT_TARGET = 0.8
SIDECAR_RULES = """topics:
  - topic: "orders-col*"
    columnar: {schema: orders.json, min_records: 100}
"""
SIDECAR_PARTITIONS = 4
# (key, who, path, topic): each step of a sidecar repetition, in order.
PRODUCE_STEPS = (
    ("direct", "direct", "orders-plain"),
    ("columnar", "kipside", "orders-col"),
    ("ordinary", "kipside", "orders-other"),
)
CONSUME_STEPS = (
    ("direct", "direct", "orders-plain"),
    ("columnar", "kipside", "orders-col"),
    ("ordinary", "kipside", "orders-plain"),
)
CASE_NAMES = {
    "direct": "direct, ordinary topic",
    "columnar": "kipside, columnar topic",
    "ordinary": "kipside, ordinary topic",
}


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


def sidecar(records: int, logdir: Path) -> dict[str, float]:
    """One repetition of the sidecar's runs on a fresh stack: their numbers, flat."""
    (logdir / "orders.json").write_text(json.dumps(json_schema()))
    out: dict[str, float] = {}
    with open_stack("kipside", logdir, rules=SIDECAR_RULES, admin=True) as stack:
        direct = f"{HOST}:{stack.broker_port}"
        topics = sorted({topic for _, _, topic in (*PRODUCE_STEPS, *CONSUME_STEPS)})
        job = {"bootstrap": stack.bootstrap, "topics": topics, "partitions": SIDECAR_PARTITIONS}
        run_json(REPO / "bench" / "_workload.py", "create-topics", json.dumps(job), timeout=60)
        digest = None
        for direction, steps in (("produce", PRODUCE_STEPS), ("consume", CONSUME_STEPS)):
            for key, who, topic in steps:
                job = {"bootstrap": direct if who == "direct" else stack.bootstrap}
                job |= {"topic": topic, "records": records, "partitions": SIDECAR_PARTITIONS}
                job |= {"linger_ms": 5, "batch_records": 100}
                window = Window.of(stack)
                got = run_json(LOAD, f"orders-{direction}", json.dumps(job), timeout=1200)
                window.close()
                proxy, broker = window.proxy_broker()
                if got["records"] != records or digest not in (None, got["digest"]):
                    raise HarnessError(
                        f"{direction} {key}: {got['records']:,} values of {records:,}, "
                        f"{'not ' if digest != got['digest'] else ''}those written"
                    )
                digest = got["digest"]
                name = f"{direction}_{key}"
                out |= {
                    f"{name}_msgs_per_s": got["msgs_per_s"],
                    f"{name}_client_cpu_s": got["cpu_s"],
                }
                out |= {f"{name}_broker_cpu_s": broker, f"{name}_wall_s": got["wall_s"]}
                out |= {f"{name}_mb": got["bytes"] / 1e6}
                noise = window.noise_cores(got["cpu_s"])
                out["noise_cores"] = max(out.get("noise_cores", 0.0), noise)
                if who == "kipside":
                    out[f"{name}_kipside_cpu_s"] = proxy
        assert stack.admin is not None
        metrics = scrape(stack.admin)
    name = "kipside_columnar_batches_total"
    out["converted_batches"] = metrics.value(name, direction="produce", outcome="converted")
    out["small_batches"] = metrics.value(name, default=0.0, direction="produce", outcome="small")
    out["decoded_batches"] = metrics.value(name, direction="fetch", outcome="converted")
    if out["converted_batches"] < records / 100 / 2:
        raise HarnessError(f"only {out['converted_batches']:.0f} batches became carriers")
    bytes_name = "kipside_columnar_bytes_total"
    ordinary = metrics.value(bytes_name, direction="produce", form="ordinary")
    out["carrier_ratio"] = metrics.value(bytes_name, direction="produce", form="carrier") / ordinary
    seconds = "kipside_columnar_cpu_seconds_total"
    out["encode_cpu_s"] = metrics.value(seconds, direction="produce")
    out["decode_cpu_s"] = metrics.value(seconds, direction="fetch")
    return out


def spread(runs: Sequence[Run], key: str, fmt: str) -> str:
    """The median of `key` over the runs, and its range when there are several."""
    values = sorted(r.metrics[key] for r in runs)
    median = statistics.median(values)
    if len(values) == 1:
        return fmt.format(median)
    return f"{fmt.format(median)} ({fmt.format(values[0])} to {fmt.format(values[-1])})"


def sidecar_tables(runs: Sequence[Run]) -> list[Table]:
    tables = []
    for direction, steps in (("produce", PRODUCE_STEPS), ("consume", CONSUME_STEPS)):
        rows = []
        for key, who, _ in steps:
            name = f"{direction}_{key}"
            for r in runs:
                r.metrics[f"{name}_vs"] = (
                    r.metrics[f"{name}_msgs_per_s"] / r.metrics[f"{direction}_direct_msgs_per_s"]
                )
                if who == "kipside":
                    r.metrics[f"{name}_kipside_s_per_mb"] = (
                        r.metrics[f"{name}_kipside_cpu_s"] / r.metrics[f"{name}_mb"]
                    )
            kipside = who == "kipside"
            rows.append(
                [
                    CASE_NAMES[key],
                    spread(runs, f"{name}_msgs_per_s", "{:,.0f}"),
                    spread(runs, f"{name}_vs", "{:.2f}x"),
                    spread(runs, f"{name}_kipside_cpu_s", "{:.2f}") if kipside else "-",
                    spread(runs, f"{name}_kipside_s_per_mb", "{:.3f}") if kipside else "-",
                    spread(runs, f"{name}_broker_cpu_s", "{:.2f}"),
                    spread(runs, f"{name}_client_cpu_s", "{:.2f}"),
                ]
            )
        headers = ["path", "msgs/s", "vs direct", "kipside CPU s", "kipside CPU s per MB"]
        headers += ["Tansu CPU s", "client CPU s"]
        title = "Produce" if direction == "produce" else "Consume"
        tables.append(Table(f"{title} (median, range over repetitions)", headers, rows))
    rows = [
        [
            "batches converted (produce / fetch)",
            spread(runs, "converted_batches", "{:,.0f}")
            + " / "
            + spread(runs, "decoded_batches", "{:,.0f}"),
        ],
        ["carrier bytes / client batch bytes", spread(runs, "carrier_ratio", "{:.2f}")],
        ["encoding CPU s (worker threads)", spread(runs, "encode_cpu_s", "{:.2f}")],
        ["decoding CPU s (worker threads)", spread(runs, "decode_cpu_s", "{:.2f}")],
    ]
    tables.append(Table("What kipside converted (its /metrics)", ["", "per repetition"], rows))
    return tables


def publish_sidecar(args: argparse.Namespace) -> None:
    runs = repeat(
        {"sidecar": partial(sidecar, args.sidecar_records)},
        args.repeats,
        noisy=10.0,  # every repetition counts: the ranges show the noise
        budget=3600,
    )
    ok = [r for r in runs if r.ok]
    if not ok:
        raise SystemExit(f"no sidecar run succeeded: {[r.error for r in runs]}")
    median = {k: statistics.median(r.metrics[k] for r in ok) for k in ok[0].metrics}
    targets = [
        Target(
            f"producing through kipside with columnar on >= {THROUGHPUT_TARGET}x direct "
            "(linger.ms 5, 100-record batches)",
            median["produce_columnar_msgs_per_s"]
            >= THROUGHPUT_TARGET * median["produce_direct_msgs_per_s"],
            f"{median['produce_columnar_msgs_per_s'] / median['produce_direct_msgs_per_s']:.2f}x",
        ),
        Target(
            f"consuming a columnar topic through kipside >= {THROUGHPUT_TARGET}x direct from an "
            "ordinary topic",
            median["consume_columnar_msgs_per_s"]
            >= THROUGHPUT_TARGET * median["consume_direct_msgs_per_s"],
            f"{median['consume_columnar_msgs_per_s'] / median['consume_direct_msgs_per_s']:.2f}x",
        ),
    ]
    noisy = sum(r.noise > 0.25 for r in ok)
    data = (
        f"Data: {args.sidecar_records:,} `orders` records (about 200 B of JSON) per run; "
        f"{len(ok)} repetitions, in {noisy} of which a step shared the machine with more than a "
        "quarter of a core of other work."
    )
    errors = [r.error for r in runs if not r.ok]
    Report(
        "columnar-sidecar",
        "Columnar topics through the sidecar: produce and consume against direct",
        facts(data, tools=["pyarrow"]),
        sidecar_tables(ok),
        targets,
        notes=[f"a repetition failed: {e}" for e in errors],
    ).publish(args)


def main() -> int:
    args = parse_args(
        __doc__,
        OPTIONS,
        {
            "records": 20_000,
            "rows": [10, 1000],
            "lake_records": 50_000,
            "sidecar_records": 30_000,
            "repeats": 1,
        },
    )
    if "sidecar" in args.parts:
        publish_sidecar(args)
    if "codec" not in args.parts:
        return 0
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
