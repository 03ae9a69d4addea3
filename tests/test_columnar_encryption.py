"""Field encryption of columnar segments (Parquet modular encryption) and the key file.

With the key, a consumer gets plaintext; without it the encrypted columns are unreadable, the
decoder refuses and says which columns and which key, and a reader of the segment still gets the
other columns. The plaintext of an encrypted field is nowhere in the segment's bytes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from columnar_kit import SCHEMA, ClientBatch, ClientRecord, json_equal, read_back

from kipside.protocol import (
    ColumnarEncoder,
    ColumnarError,
    ColumnarKeyError,
    ColumnarKeyFileError,
    ColumnarKeys,
    ColumnarOptions,
    Encoded,
    columnar_decryption_properties,
    decode_columnar_batch,
    read_columnar_segment,
    reencode_columnar_batch,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 116))
KEYS = ColumnarKeys.of({"orders-2026": KEY_A, "orders-2025": KEY_B}, "orders-2026")
SECRET = "Ada Lovelace-7f3e"
VALUES = [
    json.dumps({"id": i, "name": f"{SECRET}-{i}", "amount": i * 1.5, "tags": ["t"]}).encode()
    for i in range(40)
]
CLIENT = ClientBatch(tuple(ClientRecord(b"k%d" % i, v) for i, v in enumerate(VALUES)))


def carrier(options: ColumnarOptions) -> bytes:
    result = ColumnarEncoder(SCHEMA, options).encode(CLIENT.build())
    assert isinstance(result, Encoded), result
    return result.batch


def segment(batch: bytes) -> bytes:
    value = read_back(batch)[0][3]
    assert value is not None
    return value


ENCRYPTED = ColumnarOptions(encrypt=("name", "amount"), keys=KEYS, compression="none")


def test_with_the_key_the_values_come_back() -> None:
    batch = carrier(ENCRYPTED)
    records = decode_columnar_batch(batch, KEYS)
    assert all(json_equal(r.value, v) for r, v in zip(records, VALUES, strict=True))
    assert json_equal(read_back(reencode_columnar_batch(batch, KEYS))[3][3] or b"", VALUES[3])


def test_the_plaintext_is_not_in_the_segment() -> None:
    plain = segment(carrier(ColumnarOptions(compression="none")))
    assert SECRET.encode() in plain  # what an uncompressed segment shows without encryption
    assert SECRET.encode() not in segment(carrier(ENCRYPTED))


def test_without_the_key_the_decoder_says_what_it_needs() -> None:
    batch = carrier(ENCRYPTED)
    with pytest.raises(ColumnarKeyError) as info:
        decode_columnar_batch(batch)
    assert info.value.columns == ("name", "amount")
    assert info.value.key_id == "orders-2026"
    assert "no key file was given" in str(info.value)
    with pytest.raises(ColumnarKeyError):
        reencode_columnar_batch(batch)


def test_without_the_key_the_other_columns_are_readable() -> None:
    table = read_columnar_segment(segment(carrier(ENCRYPTED)))
    assert "name" not in table.column_names and "amount" not in table.column_names
    assert table.column("id").to_pylist() == list(range(40))
    assert table.column("kafka_key").to_pylist()[:2] == [b"k0", b"k1"]
    full = read_columnar_segment(segment(carrier(ENCRYPTED)), KEYS)
    assert full.column("name").to_pylist()[0] == f"{SECRET}-0"


def test_a_key_file_without_that_key() -> None:
    others = ColumnarKeys.of({"orders-2025": KEY_B}, "orders-2025")
    with pytest.raises(ColumnarKeyError, match="has no key 'orders-2026' \\(it has orders-2025\\)"):
        decode_columnar_batch(carrier(ENCRYPTED), others)


def test_the_wrong_key_under_the_right_id() -> None:
    impostor = ColumnarKeys.of({"orders-2026": bytes(32)}, "orders-2026")
    with pytest.raises(ColumnarKeyError, match="is not the key they were encrypted with"):
        decode_columnar_batch(carrier(ENCRYPTED), impostor)


def test_rotation_keeps_old_segments_readable() -> None:
    old = carrier(ColumnarOptions(encrypt=("name",), keys=KEYS))
    rotated = ColumnarKeys.of(
        {"orders-2026": KEY_A, "orders-2025": KEY_B, "orders-2027": bytes(range(16))},
        "orders-2027",
    )
    new = carrier(ColumnarOptions(encrypt=("name",), keys=rotated))
    for batch in (old, new):
        assert json_equal(decode_columnar_batch(batch, rotated)[0].value, VALUES[0])
    with pytest.raises(ColumnarKeyError, match="orders-2027"):
        decode_columnar_batch(new, KEYS)


def test_kept_values_are_encrypted_too() -> None:
    # lossless keeps every value whole in kafka_value: that column holds the secret as well.
    options = ColumnarOptions(encrypt=("name",), keys=KEYS, lossless=True, compression="none")
    batch = carrier(options)
    assert SECRET.encode() not in segment(batch)
    assert "kafka_value" not in read_columnar_segment(segment(batch)).column_names
    assert [r.value for r in decode_columnar_batch(batch, KEYS)] == VALUES


def test_keys_and_headers_can_be_encrypted() -> None:
    batch = carrier(ColumnarOptions(encrypt=("kafka_key",), keys=KEYS))
    assert "kafka_key" not in read_columnar_segment(segment(batch)).column_names
    assert decode_columnar_batch(batch, KEYS)[5].key == b"k5"


def test_pyarrow_reads_a_segment_with_the_decryption_properties(tmp_path: Path) -> None:
    path = tmp_path / "segment.parquet"
    path.write_bytes(segment(carrier(ENCRYPTED)))
    table = pq.read_table(path, decryption_properties=columnar_decryption_properties(KEYS))
    assert table.column("name").to_pylist()[1] == f"{SECRET}-1"
    assert table.schema.field("amount").type == pa.float64()


# ---- the key file ---------------------------------------------------------------------------


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def test_a_key_file() -> None:
    text = f"# keys\nwrite_key: a\nkeys:\n  a: {b64(KEY_A)}\n  b: '{b64(KEY_B)}'\n"
    keys = ColumnarKeys.parse(text, "keys.yaml")
    assert keys.write_key == "a" and keys.ids == ("a", "b")
    assert keys.key("a") == KEY_A and keys.key("b") == KEY_B and keys.key("c") is None
    assert b64(KEY_A) not in repr(keys) and "KEY" not in repr(keys)


KEY_FILE_ERRORS = {
    "empty": ("", 1, "the key file is empty"),
    "not yaml": ("keys: [\n", 2, "not valid YAML"),
    "a list": ("- a\n", 1, "must be a mapping"),
    "unknown key": (f"write_key: a\nkey:\n  a: {b64(KEY_A)}\n", 2, "unknown key 'key'"),
    "no keys": ("write_key: a\n", 1, "no keys"),
    "no write_key": (f"keys:\n  a: {b64(KEY_A)}\n", 1, "no write_key"),
    "write_key unknown": (f"write_key: z\nkeys:\n  a: {b64(KEY_A)}\n", 1, "'z' is not one of"),
    "bad base64": ("write_key: a\nkeys:\n  a: not*base64\n", 3, "not valid base64"),
    "short key": (f"write_key: a\nkeys:\n  a: {b64(b'x' * 10)}\n", 3, "10 bytes"),
    "bad id": (f"write_key: a\nkeys:\n  'a b': {b64(KEY_A)}\n", 3, "key id 'a b'"),
    "twice": (f"write_key: a\nkeys:\n  a: {b64(KEY_A)}\n  a: {b64(KEY_A)}\n", 4, "twice"),
    "a number": ("write_key: a\nkeys:\n  a: 12\n", 3, "not valid base64"),
}


@pytest.mark.parametrize(
    ("text", "line", "says"), KEY_FILE_ERRORS.values(), ids=list(KEY_FILE_ERRORS)
)
def test_key_file_errors(text: str, line: int, says: str) -> None:
    with pytest.raises(ColumnarKeyFileError) as info:
        ColumnarKeys.parse(text, "keys.yaml")
    assert str(info.value).startswith(f"keys.yaml:{line}: "), str(info.value)
    assert says in str(info.value)
    assert info.value.line == line
    assert b64(KEY_A) not in str(info.value)


def test_a_segment_lying_about_its_encryption_is_refused_not_fatal() -> None:
    # Encrypted by Parquet, but its kipside metadata claims nothing is: reading the encrypted
    # column must raise (pyarrow aborts the process if asked for such a column's metadata).
    from kipside.protocol.columnar_segment import SegmentMeta, SegmentWriter

    batch = carrier(ColumnarOptions(encrypt=("name",), keys=KEYS))
    table = read_columnar_segment(segment(batch), KEYS)
    writer = SegmentWriter(ColumnarOptions(encrypt=("name",), keys=KEYS))
    honest = writer.write(table, SegmentMeta(len(SCHEMA), False, {}, ("name",), "orders-2026"))
    lying_meta = SegmentMeta(len(SCHEMA), False, {}, (), None).to_json()
    honest_meta = SegmentMeta(len(SCHEMA), False, {}, ("name",), "orders-2026").to_json()
    assert len(lying_meta) < len(honest_meta)
    lying = honest.replace(honest_meta, lying_meta.ljust(len(honest_meta)))
    assert lying != honest
    with pytest.raises(ColumnarError, match="corrupt"):
        read_columnar_segment(lying)
