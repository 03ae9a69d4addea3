"""Known records for the pipeline tests: produced with real clients, read back independently.

`produce_dataset` writes records with every compression codec, keys (some null), headers,
explicit timestamps, a committed transaction and an aborted one whose records were flushed
before the abort (Tansu only writes what was flushed). It returns the records a read_committed
reader must see and the ones it must not, so tests compare with what was sent, never with what
a consumer of Tansu returns (Tansu serves aborted records to read_committed consumers).
`consume_all` reads a topic from the beginning with confluent-kafka, with a deadline.
"""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
from integration.raw_batches import read_frame
from testkit.produce import send_all

from kipside.protocol import (
    ApiKey,
    PartitionBatch,
    build_frame,
    encode_produce_request,
    encode_request_header,
    parse_produce_response,
    parse_response_header,
)

FLUSH_TIMEOUT = 30.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TIMESTAMP = 1_700_000_000_000


@dataclass(frozen=True)
class Rec:
    """A record as a consumer sees it (offsets left out: they differ between clusters)."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass(frozen=True)
class Dataset:
    bootstrap: str
    """The cluster it was produced to."""
    topic: str
    partitions: int
    committed: list[Rec]
    """What a read_committed reader must see, in produce order."""
    aborted: list[Rec]
    """Records of the aborted transaction: only read_uncommitted readers see them."""


def by_partition(records: Iterable[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    return dict(out)


def _config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": 5000,
        "client.id": "kipside-pipeline-tests",
        **extra,
    }


def _record(i: int, partition: int, tag: str) -> Rec:
    key = None if i % 7 == 0 else f"{tag}-key-{i}".encode()
    pad = "x" * (i % 50)
    value = None if i % 13 == 5 else f'{{"n": {i}, "tag": "{tag}", "pad": "{pad}"}}'.encode()
    headers: tuple[tuple[str, bytes | None], ...] = ()
    if i % 3 == 0:
        headers = (("seq", str(i).encode()), ("tag", tag.encode()), ("empty", None))
    return Rec(partition, key, value, headers, BASE_TIMESTAMP + i)


def _producer(bootstrap: str, **extra: Any) -> ck.Producer:
    return ck.Producer(_config(bootstrap, **{"linger.ms": 5, **extra}))


def _send(producer: ck.Producer, topic: str, records: Sequence[Rec], errors: list[str]) -> None:
    send_all(producer, topic, (_produced(r) for r in records), errors)


def _produced(r: Rec) -> dict[str, Any]:
    """`r` as the keyword arguments of confluent-kafka's Producer.produce."""
    return {
        "key": r.key,
        "value": r.value,
        "partition": r.partition,
        "headers": list(r.headers) or None,
        "timestamp": r.timestamp,
    }


def _flush(producer: ck.Producer, errors: list[str]) -> None:
    left = producer.flush(FLUSH_TIMEOUT)
    assert left == 0 and not errors, f"{left} undelivered, errors {errors[:3]}"


def produce_dataset(bootstrap: str, topic: str, partitions: int, per_codec: int = 300) -> Dataset:
    """Plain records in every codec, then a committed and an aborted transaction (zstd)."""
    committed: list[Rec] = []
    i = 0
    for codec in CODECS:
        producer = _producer(bootstrap, **{"compression.type": codec})
        errors: list[str] = []
        batch = [_record(i + n, (i + n) % partitions, codec) for n in range(per_codec)]
        i += per_codec
        _send(producer, topic, batch, errors)
        _flush(producer, errors)
        committed += batch
    txn = _producer(bootstrap, **{"transactional.id": f"{topic}-txn", "compression.type": "zstd"})
    txn.init_transactions(30)
    errors = []
    txn.begin_transaction()
    kept = [_record(i + n, (i + n) % partitions, "committed-txn") for n in range(40)]
    i += 40
    _send(txn, topic, kept, errors)
    txn.commit_transaction(30)
    txn.begin_transaction()
    dropped = [_record(i + n, (i + n) % partitions, "aborted-txn") for n in range(40)]
    i += 40
    _send(txn, topic, dropped, errors)
    _flush(txn, errors)  # Tansu writes only what was flushed before the abort
    txn.abort_transaction(30)
    # Plain records after the transactions, so markers sit between data on every partition.
    tail = _producer(bootstrap, **{"compression.type": "lz4"})
    after = [_record(i + n, (i + n) % partitions, "after") for n in range(60)]
    _send(tail, topic, after, errors)
    _flush(tail, errors)
    return Dataset(bootstrap, topic, partitions, committed + kept + after, dropped)


def produce_plain(
    bootstrap: str, topic: str, partitions: int, count: int, start: int = 0, codec: str = "lz4"
) -> list[Rec]:
    producer = _producer(bootstrap, **{"compression.type": codec})
    errors: list[str] = []
    records = [_record(start + n, (start + n) % partitions, "plain") for n in range(count)]
    _send(producer, topic, records, errors)
    _flush(producer, errors)
    return records


def as_rec(m: Any) -> Rec:
    headers = tuple((k, bytes(v) if v is not None else None) for k, v in (m.headers() or ()))
    return Rec(m.partition(), m.key(), m.value(), headers, m.timestamp()[1])


def consume_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    timeout: float = 60.0,
    isolation: str = "read_uncommitted",
) -> dict[int, list[tuple[int, Rec]]]:
    """Every record of every partition from the beginning to the end, as (offset, Rec)."""
    consumer = ck.Consumer(
        _config(
            bootstrap,
            **{
                "group.id": f"kipside-tests-reader-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                "fetch.wait.max.ms": 100,
            },
        )
    )
    try:
        consumer.assign(
            [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)]
        )
        out: dict[int, list[tuple[int, Rec]]] = {p: [] for p in range(partitions)}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, (
                f"{topic}: not at the end after {timeout} s ({sorted(at_end)})"
            )
            m = consumer.poll(0.2)
            if m is None:
                continue
            error, partition, offset = m.error(), m.partition(), m.offset()
            assert partition is not None and offset is not None, m
            if error is not None:
                if error.code() == ck.KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                raise AssertionError(f"consumer error on {topic}: {error}")
            at_end.discard(partition)
            out[partition].append((offset, as_rec(m)))
        return out
    finally:
        consumer.close()


def records_of(consumed: dict[int, list[tuple[int, Rec]]]) -> dict[int, list[Rec]]:
    return {p: [r for _, r in items] for p, items in consumed.items() if items}


# --------------------------------------------------------------------------- JSON records

JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
    },
    "required": ["id"],
}

# Values that can't become rows of JSON_SCHEMA, and what the quarantine must say about each.
MALFORMED: list[tuple[bytes | None, str]] = [
    (b"not json {", "the value is not JSON"),
    (b'{"id": "seven", "user": "x"}', "field 'id': expected bigint, got string"),
    (b'{"user": "nobody"}', "required field 'id' is missing or null"),
    (None, "the value is null"),
    (b"[1, 2, 3]", "the value is a JSON array, not an object"),
    (b'{"id": 8, "items": [{"sku": "a", "qty": "many"}]}', "field 'items[0].qty': expected bigint"),
]


@dataclass(frozen=True)
class JsonDataset:
    topic: str
    partitions: int
    good: list[tuple[int, dict[str, Any], int]]
    """(partition, decoded value, timestamp ms) of every value that must become a row."""
    bad: list[tuple[int, bytes | None, str]]
    """(partition, raw value, expected error text) of every value that must go to quarantine."""
    aborted: list[bytes]


def _json_value(i: int, tag: str) -> dict[str, Any]:
    return {
        "id": i,
        "user": f"{tag}-user-{i % 17}",
        "amount": round(i * 1.25, 2),
        "paid": i % 2 == 0,
        "at": f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:00Z",
        "items": [{"sku": f"SKU-{i % 9}", "qty": i % 4}],
    }


def produce_json_dataset(
    bootstrap: str, topic: str, partitions: int, per_codec: int = 200
) -> JsonDataset:
    """JSON values in every codec, malformed values among them, and a committed and an aborted
    transaction (flushed before the abort)."""
    good: list[tuple[int, dict[str, Any], int]] = []
    bad: list[tuple[int, bytes | None, str]] = []
    i = 0
    for codec in CODECS:
        producer = _producer(bootstrap, **{"compression.type": codec})
        errors: list[str] = []
        for n in range(per_codec):
            p = (i + n) % partitions
            ts = BASE_TIMESTAMP + i + n
            if n < len(MALFORMED) and codec == "gzip":
                raw, why = MALFORMED[n]
                bad.append((p, raw, why))
            else:
                value = _json_value(i + n, codec)
                raw = json.dumps(value).encode()
                good.append((p, value, ts))
            _send(producer, topic, [Rec(p, f"k{i + n}".encode(), raw, (), ts)], errors)
        _flush(producer, errors)
        i += per_codec
    txn = _producer(
        bootstrap, **{"transactional.id": f"{topic}-json-txn", "compression.type": "zstd"}
    )
    txn.init_transactions(30)
    errors = []
    txn.begin_transaction()
    for n in range(30):
        value = _json_value(i + n, "txn")
        good.append(((i + n) % partitions, value, BASE_TIMESTAMP + i + n))
        _send(
            txn,
            topic,
            [
                Rec(
                    (i + n) % partitions,
                    None,
                    json.dumps(value).encode(),
                    (),
                    BASE_TIMESTAMP + i + n,
                )
            ],
            errors,
        )
    txn.commit_transaction(30)
    i += 30
    aborted = []
    txn.begin_transaction()
    for n in range(30):
        raw = json.dumps(_json_value(i + n, "aborted")).encode()
        aborted.append(raw)
        _send(
            txn, topic, [Rec((i + n) % partitions, None, raw, (), BASE_TIMESTAMP + i + n)], errors
        )
    _flush(txn, errors)
    txn.abort_transaction(30)
    return JsonDataset(topic, partitions, good, bad, aborted)


def produce_raw(bootstrap: str, topic: str, partition: int, batches: Sequence[bytes]) -> None:
    """Write record batches exactly as given (built by the test, e.g. a decompression bomb no
    client would write), one ProduceRequest v3 each (acks=all) over a plain socket; fails on
    any error the broker answers."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for n, batch in enumerate(batches):
            body = encode_produce_request(
                3,
                acks=-1,
                timeout_ms=30_000,
                partitions=[PartitionBatch(topic, partition, memoryview(batch))],
            )
            header = encode_request_header(ApiKey.PRODUCE, 3, n, "kipside-pipeline-tests")
            sock.sendall(build_frame(header, b"".join(bytes(c) for c in body)))
            frame = read_frame(sock)
            answer = parse_response_header(frame, ApiKey.PRODUCE, 3)
            result = parse_produce_response(frame, answer.body_offset, 3).partitions[0]
            assert result.error_code == 0, f"Produce of batch {n} answered {result.error_code}"
