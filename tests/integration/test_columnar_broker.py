"""Columnar carriers through a real broker (Tansu): produced by an idempotent producer among
ordinary batches, stored, fetched back, and decoded to the records the clients' batches held.

The broker assigns offsets per record: a carrier of n records takes n offsets, the batch after it
starts n further on, and an idempotent producer's sequence numbers (which count records) carry on
across carriers and ordinary batches alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from columnar_kit import SCHEMA, ClientBatch, ClientRecord
from conftest import fresh_topic
from testkit.broker import Broker

from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
from kipside.pipeline.kafka.producer import IdempotentProducer, Written
from kipside.protocol import (
    Address,
    ColumnarEncoder,
    Encoded,
    RecordBatchView,
    columnar_version,
    decode_columnar_batch,
    decode_columns,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def client(tansu: Broker) -> Iterator[KafkaClient]:
    address = Address.parse(tansu.bootstrap, what="bootstrap")
    with KafkaClient([address], role="test cluster", config=ClientConfig()) as kafka:
        yield kafka


def batches() -> list[ClientBatch]:
    out = []
    for b, (codec, count) in enumerate([("zstd", 50), ("lz4", 1), ("none", 300), ("gzip", 7)]):
        records = tuple(
            ClientRecord(
                b"k-%d-%d" % (b, i),
                json.dumps({"id": b * 1000 + i, "name": f"n{i}", "tags": ["a"] * (i % 3)}).encode(),
                (("h", b"%d" % i),) if i % 2 else (),
                timestamp_delta=i,
            )
            for i in range(count)
        )
        out.append(ClientBatch(records, codec=codec, producer="idempotent"))
    return out


def test_carriers_and_ordinary_batches_through_the_broker(
    tansu: Broker, client: KafkaClient, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(tansu.bootstrap, "columnar", 1, request)
    encoder = ColumnarEncoder(SCHEMA)
    sent: list[tuple[ClientBatch, bytes, bool]] = []
    for i, batch in enumerate(batches()):
        built = batch.build()
        result = encoder.encode(built)
        assert isinstance(result, Encoded), result
        # Every other batch stays ordinary: a topic mixes both when values don't fit.
        sent.append((batch, result.batch if i % 2 == 0 else built, i % 2 == 0))
    producer: IdempotentProducer[int] = IdempotentProducer(client)
    for i, (_, data, _) in enumerate(sent):
        producer.add(topic, 0, RecordBatchView.from_buffer(data), i)
    written: list[Written[int]] = []
    producer.flush(written.extend)
    producer.close()
    assert [w.tag for w in written] == list(range(len(sent)))

    stored = list(RangeReader(client, FetchConfig(committed_only=False)).read(topic, 0, 0, 358))
    assert [b.records_count for b in stored] == [len(b.records) for b, _, _ in sent]
    offset = 0
    for view, (batch, _, carrier) in zip(stored, sent, strict=True):
        assert view.base_offset == offset  # n records took n offsets
        assert columnar_version(view) == (1 if carrier else None)
        records: list[tuple[Any, ...]]
        if carrier:
            records = [
                (r.offset, r.timestamp, r.key, json.loads(r.value), r.headers)
                for r in decode_columnar_batch(view)
            ]
        else:
            columns = decode_columns([view])
            records = [
                (int(columns.offset[i]), int(columns.timestamp[i]), None, None, None)
                for i in range(len(columns))
            ]
        assert [r[0] for r in records] == list(range(offset, offset + len(batch.records)))
        if carrier:
            assert records == [
                (
                    offset + i,
                    batch.base_timestamp + r.timestamp_delta,
                    r.key,
                    json.loads(r.value),
                    r.headers,
                )
                for i, r in enumerate(batch.records)
            ]
        offset += len(batch.records)
    assert offset == 358
