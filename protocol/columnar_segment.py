"""A carrier's Parquet segment: written compactly, encrypted where asked, read back within a cap.

Writing picks each column's Parquet encoding from a look at its first values (dictionary for
columns that repeat; otherwise delta encoding for integers and timestamps, byte-stream split for
doubles, delta byte arrays for text), one row group, no Arrow schema copy in the footer (Parquet's
own types say everything a reader needs). What the segment needs to be turned back into records
is in the footer's key-value metadata under `kipside.columnar` (:class:`SegmentMeta`).

Field encryption is Parquet modular encryption through pyarrow (pyarrow.parquet.encryption): each
named column gets a fresh data key, wrapped by the key file's `write_key` master key with AES-GCM
in an in-process KMS client (:class:`KeyFileKms`), the wrapped key stored in the footer. The footer
itself stays readable (`plaintext_footer`), so whoever lacks the key still reads the other
columns and the metadata, and learns which columns and which key id they would need.

Reading never trusts a size the segment claims beyond `max_bytes`; it reads no column chunk
metadata of an encrypted column without its key (pyarrow would abort the process).

Imports pyarrow (kipside.protocol loads this module on first use).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .columnar import (
    COLUMNAR_VERSION,
    SEGMENT_COLUMNS,
    ColumnarError,
    ColumnarKeyError,
    ColumnarOptions,
)
from .columnar_keys import ColumnarKeys

__all__ = [
    "META_KEY",
    "KeyFileKms",
    "SegmentMeta",
    "SegmentWriter",
    "decryption_properties",
    "open_segment",
    "read_segment",
]

META_KEY: Final = b"kipside.columnar"
_MAGIC: Final = b"PAR1"
_WRAP_PREFIX: Final = "kipside-aes-gcm-v1:"
_NONCE: Final = 12
_SAMPLE: Final = 1024
# The segment's own columns, typed as the lake types what it adds (Spark's Kafka source types).
HEADERS_TYPE: Final = pa.list_(
    pa.field(
        "element",
        pa.struct([pa.field("key", pa.string(), True), pa.field("value", pa.binary(), True)]),
        True,
    )
)
META_TYPES: Final = {
    "kafka_key": pa.binary(),
    "kafka_headers": HEADERS_TYPE,
    "kafka_timestamp": pa.timestamp("us", tz="UTC"),
    "kafka_offset_delta": pa.int32(),
    "kafka_value": pa.binary(),
}
assert tuple(META_TYPES) == SEGMENT_COLUMNS
_CACHE: Final = timedelta(hours=1)
STATISTICS_ROWS: Final = 1000
"""Segments of at least this many rows carry min/max statistics of the value's columns."""


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """What the footer says about the segment (key `kipside.columnar`, JSON)."""

    value_columns: int
    """The first this many columns are the value's fields; the segment's own follow."""
    omit_nulls: bool
    styles: dict[str, str]
    encrypted: tuple[str, ...] = ()
    key_id: str | None = None
    version: int = COLUMNAR_VERSION

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"v": self.version, "fields": self.value_columns}
        body["nulls"] = "omit" if self.omit_nulls else "write"
        if self.styles:
            body["timestamps"] = self.styles
        if self.encrypted:
            body["encrypted"] = list(self.encrypted)
            body["key"] = self.key_id
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> SegmentMeta:
        if raw is None:
            raise ColumnarError("the Parquet segment has no kipside.columnar metadata")
        try:
            body = json.loads(raw)
            version = int(body["v"])
            if version != COLUMNAR_VERSION:
                raise ColumnarError(
                    f"the segment is version {version}; this kipside reads version "
                    f"{COLUMNAR_VERSION} (upgrade kipside)"
                )
            styles = body.get("timestamps", {})
            encrypted = tuple(str(c) for c in body.get("encrypted", ()))
            key = body.get("key")
            if not isinstance(styles, dict) or body.get("nulls") not in ("omit", "write"):
                raise ValueError("bad fields")
            return cls(
                int(body["fields"]),
                body["nulls"] == "omit",
                {str(k): str(v) for k, v in styles.items()},
                encrypted,
                None if key is None else str(key),
                version,
            )
        except ColumnarError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ColumnarError(
                f"the segment's kipside.columnar metadata is unreadable: {exc}"
            ) from None


# ---- keys -----------------------------------------------------------------------------------


class KeyFileKms(pe.KmsClient):  # type: ignore[misc]
    """The KMS pyarrow asks to wrap and unwrap data keys: AES-GCM under a master key of the key
    file, the key id as associated data; the wrapped form is `kipside-aes-gcm-v1:` then base64 of
    nonce (12 bytes), ciphertext and tag."""

    def __init__(self, keys: ColumnarKeys | None) -> None:
        super().__init__()
        self.keys = keys

    def _master(self, key_id: str) -> bytes:
        key = None if self.keys is None else self.keys.key(key_id)
        if key is None:
            raise _MissingKey(key_id)
        return key

    def wrap_key(self, key_bytes: bytes, master_key_identifier: str) -> str:
        nonce = os.urandom(_NONCE)
        sealed = AESGCM(self._master(master_key_identifier)).encrypt(
            nonce, key_bytes, master_key_identifier.encode()
        )
        return _WRAP_PREFIX + base64.b64encode(nonce + sealed).decode()

    def unwrap_key(self, wrapped_key: str, master_key_identifier: str) -> bytes:
        master = self._master(master_key_identifier)
        if not wrapped_key.startswith(_WRAP_PREFIX):
            raise ValueError("a data key not wrapped by kipside's key file KMS")
        raw = base64.b64decode(wrapped_key[len(_WRAP_PREFIX) :])
        return AESGCM(master).decrypt(raw[:_NONCE], raw[_NONCE:], master_key_identifier.encode())


class _MissingKey(Exception):
    def __init__(self, key_id: str) -> None:
        super().__init__(key_id)
        self.key_id = key_id


def _factory(keys: ColumnarKeys | None) -> pe.CryptoFactory:
    return pe.CryptoFactory(lambda _config: KeyFileKms(keys))


def decryption_properties(keys: ColumnarKeys) -> pq.FileDecryptionProperties:
    """pyarrow's decryption properties for segments (and lake files) encrypted with `keys`:
    `pq.read_table(path, decryption_properties=decryption_properties(keys))`."""
    return _factory(keys).file_decryption_properties(
        pe.KmsConnectionConfig(), pe.DecryptionConfiguration(cache_lifetime=_CACHE)
    )


# ---- writing --------------------------------------------------------------------------------


def _leaves(array: pa.Array, path: str) -> Iterator[tuple[str, pa.Array]]:
    """(Parquet column path, values) of each leaf column under `array`, pyarrow's naming."""
    kind = array.type
    if pa.types.is_struct(kind):
        for i, f in enumerate(kind):
            yield from _leaves(array.field(i), f"{path}.{f.name}")
    elif pa.types.is_list(kind):
        yield from _leaves(array.flatten(), f"{path}.list.element")
    else:
        yield path, array


_DICTIONARY: Final = "dictionary"
_RESAMPLE: Final = 256
"""A topic's encodings are looked at again every this many segments (data changes)."""


_CANDIDATES: Final = {
    "integer": (_DICTIONARY, "DELTA_BINARY_PACKED", "PLAIN"),
    "floating": (_DICTIONARY, "BYTE_STREAM_SPLIT", "PLAIN"),
    "text": (_DICTIONARY, "DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY", "PLAIN"),
}


def _kind(kind: pa.DataType) -> str | None:
    if pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return "integer"
    if pa.types.is_floating(kind):
        return "floating"
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        return "text"
    return None


def _encoding_of(leaf: pa.Array, options: ColumnarOptions) -> str | None:
    """A leaf column's encoding: whichever candidate writes its first values smallest with the
    topic's codec (None: the writer's default). Which is best depends on the data (byte-stream
    split suits doubles of full precision, plain text suits doubles written with a few decimals,
    a dictionary suits anything that repeats), so it is measured, not guessed."""
    kind = _kind(leaf.type)
    if kind is None:
        return _DICTIONARY if not pa.types.is_boolean(leaf.type) else None
    sample = pa.table({"c": leaf.slice(0, _SAMPLE)})
    best, best_size = None, None
    for candidate in _CANDIDATES[kind]:
        sink = pa.BufferOutputStream()
        dictionary = candidate == _DICTIONARY
        pq.write_table(
            sample,
            sink,
            compression=options.compression,
            compression_level=options.compression_level,
            use_dictionary=dictionary,
            column_encoding=None if dictionary else {"c": candidate},
            write_statistics=False,
            store_schema=False,
        )
        size = sink.tell()
        if best_size is None or size < best_size:
            best, best_size = candidate, size
    return best


def _encodings(
    table: pa.Table, known: dict[str, str | None], fresh: bool, options: ColumnarOptions
) -> tuple[list[str], dict[str, str]]:
    """Which leaf columns get a dictionary, and the encoding of the others: what `known` says
    (a topic's choices so far), looked at again for columns it lacks or when `fresh`."""
    dictionary: list[str] = []
    encoding: dict[str, str] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        chunk = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        for path, leaf in _leaves(chunk, name):
            if fresh or path not in known:
                known[path] = _encoding_of(leaf, options)
            choice = known[path]
            if choice == _DICTIONARY:
                dictionary.append(path)
            elif choice is not None:
                encoding[path] = choice
    return dictionary, encoding


class SegmentWriter:
    """Writes segments with one topic's options (its crypto factory made once)."""

    def __init__(self, options: ColumnarOptions) -> None:
        self.options = options
        self._crypto = _factory(options.keys) if options.encrypt else None
        self._kms = pe.KmsConnectionConfig()
        self._encodings: dict[str, str | None] = {}
        self._written = 0
        self._sampled_rows = 0

    def encrypted(self, names: list[str]) -> tuple[str, ...]:
        """The columns of a segment with these columns that are encrypted."""
        if not self.options.encrypt:
            return ()
        wanted = set(self.options.encrypt) | {"kafka_value"}
        return tuple(n for n in names if n in wanted)

    def write(self, table: pa.Table, meta: SegmentMeta) -> bytes:
        # Choices made on a segment of a few rows are made again on the next bigger one.
        fresh = self._written % _RESAMPLE == 0 or table.num_rows >= 4 * self._sampled_rows
        if fresh:
            self._sampled_rows = table.num_rows
        self._written += 1
        dictionary, encoding = _encodings(table, self._encodings, fresh, self.options)
        options = self.options
        properties = None
        if self._crypto is not None and meta.encrypted:
            assert options.keys is not None
            config = pe.EncryptionConfiguration(
                footer_key=options.keys.write_key,
                column_keys={options.keys.write_key: list(meta.encrypted)},
                plaintext_footer=True,
                double_wrapping=False,
                cache_lifetime=_CACHE,
            )
            properties = self._crypto.file_encryption_properties(self._kms, config)
        sink = pa.BufferOutputStream()
        # Without store_schema the schema's own metadata is not written: add ours to the footer.
        with pq.ParquetWriter(
            sink,
            table.schema,
            compression=options.compression,
            compression_level=options.compression_level,
            use_dictionary=dictionary,
            column_encoding=encoding or None,
            # Statistics let lake queries skip files; in a small segment they would cost more
            # footer than the rows they describe.
            write_statistics=(
                list(table.column_names[: meta.value_columns])
                if table.num_rows >= STATISTICS_ROWS
                else False
            ),
            store_schema=False,
            encryption_properties=properties,
        ) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({META_KEY.decode(): meta.to_json().decode()})
        return bytes(sink.getvalue())


# ---- reading --------------------------------------------------------------------------------


def open_segment(
    data: bytes | memoryview, rows: int | None, max_bytes: int
) -> tuple[pq.ParquetFile, SegmentMeta]:
    """The segment's file and metadata, after checking its claims: `rows` rows (when given), at
    most `max_bytes` of column data, the segment's own columns typed as they must be."""
    if len(data) < 12 or bytes(data[:4]) != _MAGIC or bytes(data[-4:]) != _MAGIC:
        raise ColumnarError(f"the segment is not a Parquet file ({len(data)} bytes, no PAR1 ends)")
    footer = int.from_bytes(bytes(data[-8:-4]), "little")
    if footer > len(data) - 12 or footer > max_bytes:
        raise ColumnarError(f"the segment's footer claims {footer:,} bytes of {len(data):,}")
    try:
        file = _parquet_file(data, max_bytes)
        metadata = file.metadata
        meta = SegmentMeta.from_json((metadata.metadata or {}).get(META_KEY))
        schema = file.schema_arrow
        claimed = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    except ColumnarError:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise ColumnarError(f"the Parquet segment is corrupt: {exc}") from None
    if rows is not None and metadata.num_rows != rows:
        raise ColumnarError(f"the segment holds {metadata.num_rows} rows for {rows} records")
    if claimed > max_bytes or claimed < 0:
        raise ColumnarError(
            f"the segment's columns claim {claimed:,} bytes, over the {max_bytes:,} allowed"
        )
    own = schema.names[meta.value_columns :]
    in_order = [n for n in META_TYPES if n in own]
    if (
        not 0 < meta.value_columns < len(schema.names)
        or own != in_order
        or not {"kafka_timestamp", "kafka_offset_delta"} <= set(own)
    ):
        raise ColumnarError(f"the segment's columns {schema.names} are not a carrier's")
    for name in own:
        if not schema.field(name).type.equals(META_TYPES[name]):
            raise ColumnarError(
                f"the segment's column {name} is {schema.field(name).type}, not {META_TYPES[name]}"
            )
    for name in meta.encrypted:
        if name not in schema.names:
            raise ColumnarError(f"the segment names column {name!r} as encrypted; it has none")
    return file, meta


def read_segment(
    data: bytes | memoryview,
    keys: ColumnarKeys | None,
    max_bytes: int,
    rows: int | None = None,
    readable_only: bool = False,
) -> tuple[pa.Table, SegmentMeta]:
    """The segment as a table. Encrypted columns need `keys`; with `readable_only` they are left
    out instead (a reader without the key gets what it can read)."""
    file, meta = open_segment(data, rows, max_bytes)
    columns = None
    try:
        if meta.encrypted and (keys is None or keys.key(meta.key_id or "") is None):
            if not readable_only:
                raise _key_error(meta, keys, "")
            columns = [n for n in file.schema_arrow.names if n not in meta.encrypted]
        elif meta.encrypted:
            assert keys is not None
            file = _parquet_file(data, max_bytes, decryption_properties(keys))
        table = file.read(columns=columns)
        # Parquet readers take a string column's bytes as they are: check them (UTF-8, offsets).
        table.validate(full=True)
        _check_not_null(table)
    except _MissingKey as exc:
        raise _key_error(meta, keys, exc.key_id) from None
    except InvalidTag:
        raise _key_error(meta, keys, "", wrong=True) from None
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise ColumnarError(f"the Parquet segment is corrupt: {exc}") from None
    return table, meta


def _check_not_null(table: pa.Table) -> None:
    """A Kafka record always has an offset and a timestamp, its headers are a list (maybe
    empty), and each header has a key: a null in any of them is a damaged segment."""
    for name in ("kafka_offset_delta", "kafka_timestamp", "kafka_headers"):
        if name in table.column_names and table.column(name).null_count:
            raise ColumnarError(f"the segment's column {name} holds nulls")
    if "kafka_headers" in table.column_names:
        for chunk in table.column("kafka_headers").chunks:
            pairs = chunk.flatten()
            if pairs.null_count or pairs.field("key").null_count:
                raise ColumnarError(
                    "the segment's column kafka_headers holds a header without a key"
                )


def _parquet_file(
    data: bytes | memoryview, max_bytes: int, decryption: pq.FileDecryptionProperties | None = None
) -> pq.ParquetFile:
    return pq.ParquetFile(
        pa.BufferReader(pa.py_buffer(data)),
        thrift_string_size_limit=max_bytes,
        thrift_container_size_limit=max(1000, max_bytes // 64),
        decryption_properties=decryption,
    )


def _key_error(
    meta: SegmentMeta, keys: ColumnarKeys | None, key_id: str, wrong: bool = False
) -> ColumnarKeyError:
    key_id = key_id or meta.key_id or "?"
    columns = ", ".join(meta.encrypted)
    if wrong:
        source = keys.source if keys else "the key file"
        why = f"key {key_id!r} of {source} is not the key they were encrypted with"
    elif keys is None:
        why = "no key file was given"
    else:
        why = f"{keys.source} has no key {key_id!r} (it has {', '.join(keys.ids)})"
    return ColumnarKeyError(
        f"the segment's columns {columns} are encrypted with key {key_id!r} and {why}; "
        "give the key file that holds it",
        columns=meta.encrypted,
        key_id=key_id,
    )
