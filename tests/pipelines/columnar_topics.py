"""Columnar topics for the lake tests: carriers as the sidecar writes them (built by
ColumnarEncoder from client batches), ordinary batches between them, values that don't fit among
those, encrypted fields with a key file. Holds no tests."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from columnar_kit import BASE_TIMESTAMP, ClientBatch, ClientRecord
from conftest import fresh_topic

from kipside.pipeline.kafka.client import ClientConfig, KafkaClient
from kipside.pipeline.kafka.producer import IdempotentProducer, Written
from kipside.protocol import (
    Address,
    ColumnarEncoder,
    ColumnarKeys,
    ColumnarOptions,
    Encoded,
    RecordBatchView,
    parse_value_schema,
)

from .kafka_data import MALFORMED

KEY: Final = bytes(range(32))
KEYS: Final = ColumnarKeys.of({"lake-1": KEY}, "lake-1", "keys.yaml")
ENCRYPTED: Final = ColumnarOptions(encrypt=("user", "amount"), keys=KEYS)


def key_file(tmp: Path) -> Path:
    path = tmp / "keys.yaml"
    path.write_text(f"write_key: lake-1\nkeys:\n  lake-1: {base64.b64encode(KEY).decode()}\n")
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Columnar:
    """A columnar topic of one partition."""

    topic: str
    good: list[tuple[int, dict[str, Any], int]] = field(default_factory=list)
    """(offset, value, timestamp ms) of every record that must become a row."""
    bad: list[tuple[int, bytes, str]] = field(default_factory=list)
    """(offset, raw value, what the quarantine must say) of every value that doesn't fit."""


def _value(n: int, i: int) -> dict[str, Any]:
    return {
        "id": 1_000_000 + n,
        "user": f"u{i % 3}",
        "amount": i + 0.5,
        "paid": i % 2 == 0,
        "at": f"2026-11-0{1 + i % 9}T10:00:0{i % 10}+00:00",
        "items": [{"sku": "s", "qty": i}],
    }


def produce_columnar(
    bootstrap: str, schema: Path, options: ColumnarOptions | None = None, *, misfits: bool = False
) -> Columnar:
    """Carriers of 30 and 50 records around an ordinary batch of 4, then (with `misfits`) an
    ordinary batch of values that don't fit the schema (the sidecar passes such batches on)."""
    topic = fresh_topic(bootstrap, "lake-columnar", 1)
    arrow = parse_value_schema(schema.read_text(), schema.name).to_arrow()
    encoder = ColumnarEncoder(arrow, options)
    made = Columnar(topic)
    plan: list[tuple[int, bool]] = [(30, True), (4, False), (50, True)]
    offset = 0
    with KafkaClient(
        [Address.parse(bootstrap, what="bootstrap")], role="test cluster", config=ClientConfig()
    ) as client:
        producer: IdempotentProducer[int] = IdempotentProducer(client)
        for b, (count, carrier) in enumerate(plan):
            values = [_value(offset + i, i) for i in range(count)]
            records = tuple(
                ClientRecord(b"k%d" % v["id"], json.dumps(v).encode(), timestamp_delta=i)
                for i, v in enumerate(values)
            )
            batch = ClientBatch(records, codec="zstd", base_timestamp=BASE_TIMESTAMP + b).build()
            if carrier:
                encoded = encoder.encode(batch)
                assert isinstance(encoded, Encoded), encoded
                batch = encoded.batch
            producer.add(topic, 0, RecordBatchView.from_buffer(batch), b)
            made.good.extend((offset + i, v, BASE_TIMESTAMP + b + i) for i, v in enumerate(values))
            offset += count
        if misfits:
            bad = [(raw, why) for raw, why in MALFORMED if raw is not None]
            records = tuple(ClientRecord(None, raw) for raw, _ in bad)
            batch = ClientBatch(records, codec="lz4").build()
            assert not isinstance(encoder.encode(batch), Encoded)
            producer.add(topic, 0, RecordBatchView.from_buffer(batch), len(plan))
            made.bad.extend((offset + i, raw, why) for i, (raw, why) in enumerate(bad))
        written: list[Written[int]] = []
        producer.flush(written.extend)
        producer.close()
    return made
