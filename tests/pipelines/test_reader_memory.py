"""What decompressing costs the reader that `format("kipside")` and `kipside lake` share.

- Very compressible data that is not malicious (80 batches of one 8 MiB value of zeros, about
  28 KB each compressed) keeps a reading process's peak RSS growth under 256 MiB: chunks are cut
  by decompressed bytes, never by what the broker sent.
- A decompression bomb (one batch of 4 KB of zstd that expands to 128 MiB, over
  receive.message.max.bytes) stops the read with one line naming the partition, the offset and
  the option, and nothing at or past it is written.

The reader is measured in a process of its own running the code a Spark task runs
(`read_range`), so the peak (ru_maxrss) is exact and belongs to the read alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import cramjam
import pytest
from batches import Header
from conftest import fresh_topic
from testkit.broker import Broker

from kipside.pipeline.jobrun import root_cause
from kipside.protocol import Record, encode_batch
from kipside.protocol.primitives import write_varint

from .kafka_data import produce_raw

pytestmark = [pytest.mark.integration]

ZEROS = 8 << 20
BATCHES = 80
GROWTH_LIMIT_MIB = 256
ZSTD = 4

_READ = """
import json, resource, sys
import pyarrow.compute as pc
from kipside.pipeline.source.datasource import read_range
from kipside.pipeline.source.options import parse_source_options
from kipside.pipeline.source.ranges import OffsetRange

options = parse_source_options(json.loads(sys.argv[1]), streaming=False)
topic, end = sys.argv[2], int(sys.argv[3])
# Warm up (imports, the compiled kernels) on the first record, then measure the whole read.
for _ in read_range(options, OffsetRange(topic, 0, 0, 1)):
    pass
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
values = rows = 0
for chunk in read_range(options, OffsetRange(topic, 0, 0, end)):
    rows += chunk.num_rows
    values += pc.sum(pc.binary_length(chunk.column("value"))).as_py() or 0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rows": rows, "values": values, "growth_kib": after - before}))
"""


def test_very_compressible_values_keep_the_reader_small(source_broker: Broker) -> None:
    topic = fresh_topic(source_broker.bootstrap, "zeros", 1)
    producer = ck.Producer(
        {
            "bootstrap.servers": source_broker.bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": 2 * ZEROS,
            "linger.ms": 0,
        }
    )
    value = bytes(ZEROS)
    for _ in range(BATCHES):  # one record per batch: flushed one by one
        producer.produce(topic, value=value, partition=0)
        assert producer.flush(30) == 0
    options = {"kafka.bootstrap.servers": source_broker.bootstrap, "subscribe": topic}
    done = subprocess.run(
        [sys.executable, "-c", _READ, json.dumps(options), topic, str(BATCHES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["rows"] == BATCHES
    assert read["values"] == BATCHES * ZEROS, "every value read back whole"
    growth_mib = read["growth_kib"] / 1024
    print(f"reader peak RSS growth: {growth_mib:.0f} MiB for {BATCHES} x 8 MiB of zeros")
    assert growth_mib < GROWTH_LIMIT_MIB


def _bomb(expands_to: int) -> bytes:
    """One zstd batch of one record whose value is `expands_to` zero bytes (a few KB)."""
    body = bytearray(b"\x00")  # attributes
    body += write_varint(0) + write_varint(0)  # timestampDelta, offsetDelta
    body += write_varint(-1) + write_varint(expands_to)  # no key; the value's length
    length = len(body) + expands_to + 1  # ... the value, then a header count of 0
    compressor = cramjam.zstd.Compressor()
    compressor.compress(write_varint(length) + bytes(body))
    chunk = bytes(16 << 20)
    for _ in range(expands_to // len(chunk)):
        compressor.compress(chunk)
    compressor.compress(bytes(expands_to % len(chunk)) + write_varint(0))
    return Header(attributes=ZSTD).around(bytes(compressor.finish()))


def _plain(values: list[bytes]) -> bytes:
    return encode_batch([Record(None, v) for v in values], base_timestamp=1_700_000_000_000)


@pytest.mark.spark
def test_a_decompression_bomb_stops_the_lake_naming_partition_offset_and_option(
    spark: Any, source_broker: Broker, tmp_path: Path
) -> None:
    from pyspark.sql.types import StructType

    from kipside.pipeline.lake.job import LakeJob, _Written, start_query
    from kipside.pipeline.lake.schema import load_schema

    topic = fresh_topic(source_broker.bootstrap, "bomb", 1)
    good = [json.dumps({"n": n}).encode() for n in range(20)]
    bomb = _bomb(128 << 20)
    assert len(bomb) < 8192, "a bomb is small"
    produce_raw(source_broker.bootstrap, topic, 0, [_plain(good[:10]), bomb, _plain(good[10:])])
    schema_file = tmp_path / "n.ddl"
    schema_file.write_text("n BIGINT")
    job = LakeJob(
        bootstrap=source_broker.bootstrap,
        topics=re.escape(topic),
        schema=str(schema_file),
        out=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        once=True,
        max_offsets_per_trigger=10,  # offsets 0-9 first, then the bomb's micro-batch
    )
    schema = load_schema(job.schema, StructType.fromDDL)
    query = start_query(spark, job, schema, _Written())
    with pytest.raises(Exception) as failure:
        query.awaitTermination(180)
    line = root_cause(failure.value)
    assert "\n" not in line
    assert re.match(
        rf"{re.escape(topic)}-0: the zstd batch at offset 10 decompresses to more than "
        r"100,000,000 bytes .*kafka\.receive\.message\.max\.bytes.*nothing was read past offset 9",
        line,
    ), line
    written = spark.read.parquet(str(tmp_path / "out")).select("n", "kafka_offset").collect()
    assert sorted((r.n, r.kafka_offset) for r in written) == [(n, n) for n in range(10)]
