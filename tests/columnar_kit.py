"""Client batches, schemas and an Apache Kafka stand-in for the columnar carrier tests.

Client batches are written by kafka-python's DefaultRecordBatchBuilder (an independent writer of
Kafka's format, every codec), and read back by its DefaultRecordBatch, so the carrier is checked
against the format and not against kipside's own reader. `kafka_validates` applies the checks
Apache Kafka's broker makes of a produced batch (storage/.../log/LogValidator.java and
DefaultRecordBatch), and `kafka_rebuilds` is what it writes instead when it can't keep the batch
as sent (another codec for the topic, inner offsets not sequential). Holds no tests.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kipside.protocol import RecordBatchView, parse_json_schema

BASE_TIMESTAMP: Final = 1_700_000_000_000
CODECS: Final = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PRODUCERS: Final = {
    "plain": (False, -1, -1, -1),
    "idempotent": (False, 4242, 7, 100),
    "transactional": (True, 2**40 + 3, 32000, 2**31 - 10_000),
}

# Every type a columnar schema takes, nested too. `id` is required.
SCHEMA_DOC: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "amount": {"type": "number"},
        "ok": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer"},
                    "seen": {"type": "string", "format": "date-time"},
                },
            },
        },
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "zip": {"type": "string"}},
        },
    },
    "required": ["id"],
}
SCHEMA: Final = parse_json_schema(json.dumps(SCHEMA_DOC), "test.json").to_arrow()
# DDL types the JSON Schema subset lacks.
NARROW: Final = pa.schema(
    [
        pa.field("n", pa.int64(), False),
        pa.field("small", pa.int8()),
        pa.field("price", pa.decimal128(10, 2)),
        pa.field("local", pa.timestamp("us")),
    ]
)


@dataclass(frozen=True)
class ClientRecord:
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_delta: int = 0


@dataclass(frozen=True)
class ClientBatch:
    records: tuple[ClientRecord, ...]
    codec: str = "none"
    producer: str = "plain"
    base_timestamp: int = BASE_TIMESTAMP
    extra: dict[str, Any] = field(default_factory=dict)

    def build(self) -> bytes:
        """The batch as kafka-python's producer writes it."""
        is_txn, pid, epoch, seq = PRODUCERS[self.producer]
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=CODECS[self.codec],
            is_transactional=is_txn,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            batch_size=1 << 30,
        )
        for i, r in enumerate(self.records):
            builder.append(
                i,
                timestamp=self.base_timestamp + r.timestamp_delta,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
            )
        return bytes(builder.build())


def read_back(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    """(offset, timestamp, key, value, headers) of each record, as kafka-python reads them."""
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The batch as a broker stores it: baseOffset set (not covered by the CRC)."""
    return base_offset.to_bytes(8, "big", signed=True) + batch[8:]


def json_equal(a: bytes, b: bytes) -> bool:
    return bool(json.loads(a) == json.loads(b))


# ---- Apache Kafka's checks of a produced batch ----------------------------------------------


def kafka_validates(
    batch: bytes,
    *,
    compacted: bool = False,
    now: int = BASE_TIMESTAMP,
    before_max_ms: int = 2**62,
    after_max_ms: int = 2**62,
) -> tuple[bool, str]:
    """(in place, why not) after Apache Kafka's LogValidator checks, or AssertionError for a
    batch it refuses. In place: the broker stores the batch as sent (same codec as the topic's);
    otherwise it rebuilds it (kafka_rebuilds)."""
    view = RecordBatchView.from_buffer(batch)
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc(), "CORRUPT_MESSAGE: the CRC does not match"
    count = view.records_count
    assert count > 0, "INVALID_RECORD: invalid reported count"
    assert view.last_offset_delta + 1 == count, "INVALID_RECORD: inconsistent offset range"
    assert not view.is_control, "INVALID_RECORD: clients may not write control records"
    if view.producer_id >= 0:
        assert view.base_sequence >= 0, "INVALID_RECORD: invalid sequence number"
    records = list(theirs)  # DefaultRecordBatch reads exactly `count` records or fails
    assert len(records) == count, "INVALID_RECORD: record count"
    in_place, why = True, ""
    for index, record in enumerate(records):
        if compacted:
            assert record.key is not None, f"INVALID_RECORD: record {index} has no key"
        if view.timestamp_type == 0:
            diff = now - record.timestamp
            assert diff <= before_max_ms and -diff <= after_max_ms, "INVALID_TIMESTAMP"
        else:
            raise AssertionError("INVALID_TIMESTAMP: producer set LogAppendTime")
        if view.compression != 0 and record.offset - view.base_offset != index:
            in_place, why = False, f"inner offset of record {index} is not {index}"
    return in_place, why


Edit = Callable[[int, bytes | None, bytes | None, list[Any]], tuple[Any, Any, Any]]


def kafka_rebuilds(batch: bytes, codec: str, edit: Edit | None = None) -> bytes:
    """The batch as Kafka writes it when it can't keep it (buildRecordsAndAssignOffsets): the
    same producer fields and records (key, value, headers, timestamp), sequential offsets, the
    topic's codec. `edit(index, key, value, headers)` may change records on the way (to make bad
    carriers)."""
    view = RecordBatchView.from_buffer(batch)
    theirs = DefaultRecordBatch(batch)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=view.is_transactional,
        producer_id=view.producer_id,
        producer_epoch=view.producer_epoch,
        base_sequence=view.base_sequence,
        batch_size=1 << 30,
    )
    for i, record in enumerate(theirs):
        key, value, headers = record.key, record.value, list(record.headers)
        if edit is not None:
            key, value, headers = edit(i, key, value, headers)
        builder.append(i, timestamp=record.timestamp, key=key, value=value, headers=headers)
    return with_base_offset(bytes(builder.build()), view.base_offset)


# ---- hypothesis -----------------------------------------------------------------------------

_YEAR_9999_END: Final = 315_537_897_599_999_999  # microseconds from 0001-01-01
# Random text, and text that looks like JSON's own tokens (which must stay text).
_text = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(["null", '"name":null', "{,", "\\", '"', "\n", "\u2028"]),
)


@st.composite
def timestamp_texts(draw: st.DrawFn, style: str) -> str:
    """An ISO 8601 UTC timestamp written the way `style` says (a producer's habit)."""
    micros = draw(st.integers(0, _YEAR_9999_END))
    if draw(st.booleans()):
        micros -= micros % 1_000_000  # whole seconds are common
    seconds, fraction = divmod(micros, 1_000_000)
    when = dt.datetime(1, 1, 1) + dt.timedelta(seconds=seconds)
    text = when.isoformat(timespec="seconds")
    if style == "java":  # Instant.toString: no fraction when 0, else 3 or 6 digits
        if fraction:
            text += f".{fraction // 1000:03d}" if fraction % 1000 == 0 else f".{fraction:06d}"
        return text + "Z"
    if style == "js":  # Date.toISOString: always milliseconds
        return text + f".{fraction // 1000:03d}Z"
    if style == "python":  # isoformat with a UTC zone
        return text + (f".{fraction:06d}" if fraction else "") + "+00:00"
    return text + f".{fraction:06d}Z"


@st.composite
def values(draw: st.DrawFn, style: str = "java") -> bytes:
    """A JSON object that fits SCHEMA: fields present, null or missing, in any order, sometimes
    a field the schema lacks, sometimes written with spaces or over several lines."""
    doc: dict[str, Any] = {"id": draw(st.integers(-(2**63), 2**63 - 1))}
    optional: dict[str, Any] = {
        "name": _text,
        "amount": st.one_of(
            st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**53), 2**53)
        ),
        "ok": st.booleans(),
        "at": timestamp_texts(style),
        "day": st.dates().map(lambda d: d.isoformat()),
        "tags": st.lists(st.one_of(_text, st.none()), max_size=3),
        "items": st.lists(
            st.fixed_dictionaries(
                {"sku": _text, "qty": st.integers(-(2**31), 2**31)},
                optional={"seen": timestamp_texts(style)},
            ),
            max_size=3,
        ),
        "customer": st.fixed_dictionaries({}, optional={"name": _text, "zip": _text}),
    }
    for name, strategy in optional.items():
        how = draw(st.sampled_from(["value", "value", "value", "null", "missing"]))
        if how == "value":
            doc[name] = draw(strategy)
        elif how == "null":
            doc[name] = None
    if draw(st.integers(0, 9)) == 0:
        doc["unknown"] = draw(st.one_of(st.integers(), _text, st.none()))
    order = draw(st.permutations(list(doc)))
    doc = {k: doc[k] for k in order}
    layout = draw(st.sampled_from(["compact", "compact", "spaced", "lines"]))
    if layout == "compact":
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=draw(st.booleans()))
    else:
        text = json.dumps(doc, indent=2 if layout == "lines" else None)
    return text.encode()


headers = st.lists(st.tuples(_text, st.one_of(st.none(), st.binary(max_size=8))), max_size=3).map(
    tuple
)
keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=16))


@st.composite
def client_batches(draw: st.DrawFn, max_records: int = 20) -> ClientBatch:
    style = draw(st.sampled_from(["java", "js", "python", "micros"]))
    records = draw(
        st.lists(
            st.builds(
                ClientRecord,
                key=keys,
                value=values(style),
                headers=headers,
                timestamp_delta=st.integers(-100_000, 10_000_000),
            ),
            min_size=1,
            max_size=max_records,
        )
    )
    return ClientBatch(
        tuple(records),
        codec=draw(st.sampled_from(list(CODECS))),
        producer=draw(st.sampled_from(list(PRODUCERS))),
        base_timestamp=draw(st.integers(0, 2**41)),
    )
