"""`spark.read.format("kipside")` on a columnar topic: carriers give the records their producers
sent (offsets, keys, values, headers), next to the topic's ordinary batches; with option
valueSchema, their values as typed columns instead of JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from columnar_kit import SCHEMA, ClientBatch, ClientRecord
from conftest import fresh_topic
from testkit.broker import Broker

from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
from kipside.pipeline.kafka.producer import IdempotentProducer, Written
from kipside.protocol import Address, ColumnarEncoder, Encoded, RecordBatchView

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_batch_read_gives_the_producers_records_of_carriers(
    spark: Any, source_broker: Broker, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "columnar-source", 1, request)
    encoder = ColumnarEncoder(SCHEMA)
    sent: list[tuple[int, bytes | None, bytes, tuple[tuple[str, bytes | None], ...]]] = []
    carried: list[bool] = []
    address = Address.parse(source_broker.bootstrap, what="bootstrap")
    with KafkaClient([address], role="test cluster", config=ClientConfig()) as client:
        producer: IdempotentProducer[int] = IdempotentProducer(client)
        for b, count in enumerate((40, 3, 25)):  # a carrier, an ordinary batch, a carrier
            records = tuple(
                ClientRecord(
                    b"k%d" % (len(sent) + i), b'{"id":%d,"name":"n"}' % i, (("h", b"%d" % i),)
                )
                for i in range(count)
            )
            batch = ClientBatch(records, codec="zstd").build()
            if b != 1:
                carrier = encoder.encode(batch)
                assert isinstance(carrier, Encoded)
                batch = carrier.batch
            producer.add(topic, 0, RecordBatchView.from_buffer(batch), b)
            sent += [(len(sent) + i, r.key, r.value, r.headers) for i, r in enumerate(records)]
            carried += [b != 1] * count
        written: list[Written[int]] = []
        producer.flush(written.extend)
        producer.close()
    options = {"kafka.bootstrap.servers": source_broker.bootstrap, "subscribe": topic}
    df = spark.read.format("kipside").options(**options, includeHeaders="true").load()
    rows = sorted(df.collect(), key=lambda row: row.offset)
    got = [
        (row.offset, row.key, row.value, tuple((h.key, h.value) for h in row.headers))
        for row in rows
    ]
    assert got == sent

    # With valueSchema (Spark DDL here): carriers' values as the struct, ordinary ones as bytes.
    typed = spark.read.format("kipside").options(**options, valueSchema="id BIGINT, name STRING")
    rows = sorted(typed.load().collect(), key=lambda row: row.offset)
    assert [row.key for row in rows] == [key for _, key, _, _ in sent]
    for row, (offset, _, value, _), is_carrier in zip(rows, sent, carried, strict=True):
        assert row.offset == offset
        if is_carrier:
            assert row.value is None
            assert row.valueColumns.asDict() == json.loads(value)
        else:
            assert (row.value, row.valueColumns) == (value, None)
