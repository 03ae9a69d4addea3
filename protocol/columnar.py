"""The columnar carrier's vocabulary: its version and marker, options, results and errors.

A columnar topic's record batches travel as carriers (docs/columnar.md): one Kafka record batch
per client batch, with the same record count, offsets, timestamps, producer id, epoch, sequence
and transactional bit, whose first record's value is a Parquet segment holding every record
(the values' typed columns, key, headers, timestamp, offset delta) and whose other records are
empty placeholders. The codec itself (protocol.columnar_codec, with the JSON columns of
protocol.columnar_json and the Parquet segment of protocol.columnar_segment) needs pyarrow and
the record kernels, so kipside.protocol loads it on first use; this module needs neither, so
the rules and the sidecar can name options and results without loading them.

Sans-I/O like the rest of kipside.protocol: no trio, sockets or other kipside package.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass
from typing import Final

from .columnar_keys import ColumnarKeys
from .errors import ProtocolError
from .records import TimestampType
from .value_schema import Atomic, DecimalOf, MapOf, ValueSchema, ValueSchemaError, walk_types

__all__ = [
    "COLUMNAR_COMPRESSIONS",
    "COLUMNAR_EXTRA",
    "COLUMNAR_HEADER",
    "COLUMNAR_VERSION",
    "DEFAULT_MAX_DECODED_BYTES",
    "LAKE_COLUMNS",
    "SEGMENT_COLUMNS",
    "ColumnarError",
    "ColumnarKeyError",
    "ColumnarOptions",
    "ColumnarRecord",
    "Encoded",
    "NotEncodable",
    "NotEncodableKind",
    "check_columnar_schema",
    "columnar_missing",
]

COLUMNAR_VERSION: Final = 1
"""The carrier format's version: the one byte of the marker header's value."""
COLUMNAR_HEADER: Final = "kipside.columnar"
"""The marker: a header of this name on a carrier's first record, its value the version byte."""

# The columns a segment adds after the value's fields. Named as the lake names what it adds,
# so the lake can land a segment as it is.
SEGMENT_COLUMNS: Final = (
    "kafka_key",
    "kafka_headers",
    "kafka_timestamp",
    "kafka_offset_delta",
    "kafka_value",
)
LAKE_COLUMNS: Final = ("topic", "date", "kafka_partition", "kafka_offset", "kafka_timestamp")
"""What `kipside lake` adds to a row; a columnar schema may not use these names either."""

COLUMNAR_COMPRESSIONS: Final = ("zstd", "snappy", "gzip", "lz4", "none")
COLUMNAR_EXTRA: Final = "columnar"
_EXTRA_MODULES: Final = ("pyarrow", "numpy", "numba", "cramjam")
DEFAULT_MAX_DECODED_BYTES: Final = 256 * 1024 * 1024
"""What decoding one carrier may allocate at most: its decompressed records, its Parquet
segment's columns, the values it becomes (Kafka's fetch.max.bytes default is 50 MiB)."""


def columnar_missing() -> str | None:
    """What to install for the columnar codec, or None when it is installed."""
    missing = [m for m in _EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"columnar topics need {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
        f"not installed: pip install 'kipside[{COLUMNAR_EXTRA}]'"
    )


def check_columnar_schema(schema: ValueSchema) -> None:
    """Refuse a schema a carrier can't hold values of exactly: a type JSON can't fill (BINARY,
    MAP), or FLOAT (32 bits can't hold a JSON number's value), or a field named like a column the
    segment or the lake adds. Raises ValueSchemaError at the field's line."""
    taken = (*SEGMENT_COLUMNS, *(c for c in LAKE_COLUMNS if c not in SEGMENT_COLUMNS))
    schema.check_reserved(taken, "a columnar segment or the lake")
    for f in schema.struct.fields:
        for kind in walk_types(f.type):
            problem = None
            if isinstance(kind, MapOf):
                problem = "a MAP (write it as a STRUCT of the fields, or a STRING)"
            elif isinstance(kind, Atomic) and kind.name == "binary":
                problem = "BINARY (JSON has no bytes; use STRING)"
            elif isinstance(kind, Atomic) and kind.name == "float":
                problem = "FLOAT (32 bits can't hold every JSON number as written; use DOUBLE)"
            elif isinstance(kind, DecimalOf) and kind.precision > 38:
                problem = "a DECIMAL wider than 38 digits"
            if problem:
                line = schema.line_of(f.name)
                raise ValueSchemaError(
                    f"{schema.source}:{line}: field {f.name!r} holds {problem}: a columnar topic "
                    "keeps values exactly, and this type can't",
                    line=line,
                )


class ColumnarError(ProtocolError):
    """A carrier can't be decoded: truncated, an unknown version, a corrupt or oversized segment,
    or records that don't agree with it. The message says what and where."""


class ColumnarKeyError(ColumnarError):
    """A segment's encrypted columns can't be read: no key file given, the file lacks the key
    the segment names, or the key is wrong. `columns` and `key_id` say which."""

    def __init__(self, message: str, *, columns: tuple[str, ...], key_id: str) -> None:
        super().__init__(message)
        self.columns = columns
        self.key_id = key_id


@dataclass(frozen=True, slots=True)
class ColumnarOptions:
    """How carriers of a topic are written (a columnar rule's settings)."""

    compression: str = "zstd"
    """The Parquet segment's codec: one of COLUMNAR_COMPRESSIONS."""
    compression_level: int | None = None
    """The codec's level; None for the codec's default."""
    lossless: bool = False
    """Keep every value's original bytes too (column kafka_value), so they come back byte for
    byte, not only equal as JSON."""
    encrypt: tuple[str, ...] = ()
    """Top-level fields (or kafka_key, kafka_headers) to encrypt with Parquet modular encryption;
    kafka_value, when written, is encrypted too whenever anything is."""
    keys: ColumnarKeys | None = None
    """The key file: needed when `encrypt` names anything."""

    def __post_init__(self) -> None:
        if self.compression not in COLUMNAR_COMPRESSIONS:
            raise ValueError(
                f"compression {self.compression!r}: use one of {', '.join(COLUMNAR_COMPRESSIONS)}"
            )
        if self.encrypt and self.keys is None:
            raise ValueError("encrypt names columns but no keys are given")


class NotEncodableKind(enum.Enum):
    """Why a client's batch stays as it is (the caller passes it on unchanged)."""

    MISFIT = "misfit"
    """A value doesn't fit the schema (not JSON, not an object, a wrong type, a required field
    missing, a null value)."""
    MALFORMED = "malformed"
    """The batch itself is not what a producer may send (bad CRC, control batch, offsets that
    don't count from 0, unreadable records); the broker will say so."""
    CARRIER = "carrier"
    """The batch already is a carrier (copied from another columnar topic)."""


@dataclass(frozen=True, slots=True)
class NotEncodable:
    """The encoder's answer for a batch it leaves alone: why, and which record (0-based) if one."""

    kind: NotEncodableKind
    reason: str
    record: int | None = None

    def __str__(self) -> str:
        where = "" if self.record is None else f"record {self.record}: "
        return f"{where}{self.reason}"


@dataclass(frozen=True, slots=True)
class Encoded:
    """A carrier: `batch` to send in place of the client's batch of `records` records."""

    batch: bytes
    records: int
    original_bytes: int
    verbatim: int
    """Values kept whole (column kafka_value) because their typed form would not give back equal
    JSON: a field the schema lacks, a missing field told apart from a null one, a timestamp
    written in another form. All of them with `lossless`."""

    @property
    def ratio(self) -> float:
        return len(self.batch) / self.original_bytes


@dataclass(frozen=True, slots=True)
class ColumnarRecord:
    """One record as its producer sent it, decoded from a carrier."""

    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
