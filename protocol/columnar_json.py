"""JSON record values to typed Arrow columns and back, a batch at a time, keeping them exact.

The way in is pyarrow's JSON reader with the schema given (C++, no Python per record): the
values, one per line, become a table. The way out writes JSON text with Arrow's compute kernels,
column by column, so decoding a batch makes no Python object per record either.

Typed columns lose what JSON can say and a table can't: a field the schema doesn't name, whether
a null field was written or left out, how a timestamp was written. So the way in also works out,
in bulk, which values would not come back equal as JSON (the same fields and values; numbers
compared as numbers), and keeps those values whole beside their typed row:
- a value with a field the schema lacks (the reader reports the extra fields);
- a value with a null anywhere: written out both ways (nulls written, nulls left out), parsed,
  and compared with the original; the batch takes the way that fits more of them;
- a timestamp or date whose text is not what the column's rendering gives back. Each column's
  rendering (fraction digits and zone suffix, :data:`TIMESTAMP_STYLES`) is chosen to fit most of
  its values.
Only the values with a null look at Python's json module, one by one; the rest never do.

A value that doesn't fit at all (not JSON, not an object, a wrong type, a required field missing
or null, a null value) is a :class:`Misfit` naming the first such record, found by halving the
batch until one record is left.

Imports pyarrow and numpy (kipside.protocol loads this module on first use).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .record_columns import Binary, _gather

__all__ = [
    "TIMESTAMP_STYLES",
    "JsonPlan",
    "Misfit",
    "Typed",
    "json_texts",
    "to_columns",
]

Mask = npt.NDArray[np.bool_]

# How a timestamp is written back: fraction digits (fixed 0, 3 or 6; "t3": none when whole
# seconds, else 3 or 6 digits, as Java's Instant prints; "t6": none or 6, as Python's isoformat)
# and the zone suffix.
TIMESTAMP_STYLES: Final = tuple(
    f"{fraction}{suffix}"
    for suffix in ("Z", "+00:00", "")
    for fraction in ("0", "3", "6", "t3", "t6")
)
_SUFFIXES: Final = ("+00:00", "Z", "")
_NEWLINE: Final = 10
_RETURN: Final = 13
_OPEN: Final = ord("{")
_CLOSE: Final = ord("}")
_ROW_IN_MESSAGE: Final = re.compile(r"\s*in row \d+")
# Control characters JSON strings must escape; the common ones are replaced in bulk.
_CONTROL: Final = "[\\x00-\\x1f]"
_ESCAPES: Final = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


@dataclass(frozen=True, slots=True)
class Misfit:
    """The first value that doesn't fit the schema, and why."""

    record: int
    reason: str


@dataclass(frozen=True)
class Typed:
    """A batch of values as typed columns, with what is needed to write them back."""

    table: pa.Table
    verbatim: Mask
    """Rows whose value must be kept whole: its typed row would not give back equal JSON."""
    omit_nulls: bool
    """Write a null field by leaving it out (else as `null`)."""
    styles: dict[str, str]
    """The rendering of each timestamp column, by path (`items[].at`)."""


def _check_type(kind: pa.DataType, path: str) -> None:
    if pa.types.is_struct(kind):
        for child in kind:
            _check_type(child.type, f"{path}.{child.name}")
    elif pa.types.is_list(kind):
        _check_type(kind.value_type, f"{path}[]")
    elif not (
        pa.types.is_boolean(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_float64(kind)
        or pa.types.is_decimal128(kind)
        or pa.types.is_string(kind)
        or pa.types.is_date32(kind)
        or (pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz in (None, "UTC"))
    ):
        raise ValueError(
            f"field {path!r}: {kind} can't hold JSON values exactly (columnar schemas take "
            "booleans, integers, double, decimal128, string, date32, timestamp[us] (UTC or "
            "none), lists and structs)"
        )


def _has_floats(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return any(_has_floats(f.type) for f in kind)
    if pa.types.is_list(kind):
        return _has_floats(kind.value_type)
    return bool(pa.types.is_floating(kind))


def _as_text_type(kind: pa.DataType) -> pa.DataType:
    """`kind` with timestamps and dates as strings: what the JSON reader is asked for (it can't
    read dates, and the text is needed to check the rendering)."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _as_text_type(f.type), True) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(pa.field("element", _as_text_type(kind.value_type), True))
    if pa.types.is_timestamp(kind) or pa.types.is_date32(kind):
        return pa.string()
    return kind


def _nullable(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _nullable(f.type), True) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(pa.field("element", _nullable(kind.value_type), True))
    return kind


def _has_text_types(kind: pa.DataType) -> bool:
    return not kind.equals(_as_text_type(kind))


@dataclass(frozen=True)
class JsonPlan:
    """What reading values against one schema needs, worked out once per schema."""

    target: pa.Schema
    """The value columns as stored: every field nullable."""
    parse: pa.Schema
    """What the JSON reader is asked for."""
    required: tuple[str, ...]
    names: tuple[str, ...] = field(init=False)
    floats: bool = field(init=False)
    """Whether any column holds doubles (which the JSON reader fills with NaN too)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.target.names))
        object.__setattr__(self, "floats", any(_has_floats(f.type) for f in self.target))

    @classmethod
    def of(cls, schema: pa.Schema) -> JsonPlan:
        """The plan for values of `schema`; a top-level field not nullable is required. Raises
        ValueError naming a field whose type JSON values can't fill exactly."""
        if len(schema) == 0:
            raise ValueError("the schema has no fields")
        for f in schema:
            _check_type(f.type, f.name)
        target = pa.schema([pa.field(f.name, _nullable(f.type), True) for f in schema])
        parse = pa.schema([pa.field(f.name, _as_text_type(f.type), True) for f in target])
        required = tuple(f.name for f in schema if not f.nullable)
        return cls(target, parse, required)


# ---- the way in -----------------------------------------------------------------------------


def _lines(values: Binary, replaced: dict[int, bytes]) -> bytes:
    """The values one per line (odd ones replaced by their compact form)."""
    n = len(values.valid)
    if replaced:
        parts = [
            replaced.get(i, values.data[values.offsets[i] : values.offsets[i + 1]].tobytes())
            for i in range(n)
        ]
        return b"\n".join(parts) + b"\n"
    starts = values.offsets[:-1].astype(np.int64)
    lengths = (values.offsets[1:] - values.offsets[:-1]).astype(np.int64)
    out = np.full(len(values.data) + n, _NEWLINE, dtype=np.uint8)
    _gather(values.data, starts, lengths, starts + np.arange(n, dtype=np.int64), out)
    return out.tobytes()


def _read(lines: bytes, schema: pa.Schema, unexpected: str) -> pa.Table:
    # One block for the whole batch; a bigger one only costs its allocation.
    read = pj.ReadOptions(use_threads=False, block_size=max(4096, len(lines) + 1))
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected)
    return pj.read_json(pa.py_buffer(lines), read_options=read, parse_options=parse)


def _reason(exc: Exception) -> str:
    return _ROW_IN_MESSAGE.sub("", str(exc)).strip()


def _first_failure(n: int, attempt: Callable[[int, int], str | None]) -> tuple[int, str] | None:
    """The first index i whose slice [i, i+1) fails `attempt` (which returns why a slice fails,
    or None), by halving: log2(n) attempts on ever smaller slices, so about 2n values read."""
    lo, hi = 0, n
    why = attempt(lo, hi)
    if why is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        left = attempt(lo, mid)
        if left is not None:
            hi, why = mid, left
        else:
            lo = mid  # each value is read on its own line: the failure is on the right
    return lo, attempt(lo, lo + 1) or why


def _odd_rows(values: Binary) -> npt.NDArray[np.int64]:
    """Rows that are not one line from `{` to `}`: they are read by json first."""
    starts = values.offsets[:-1].astype(np.int64)
    ends = values.offsets[1:].astype(np.int64)
    empty = ends <= starts
    data = values.data
    safe_start = np.minimum(starts, max(len(data) - 1, 0))
    safe_end = np.maximum(ends - 1, 0)
    if len(data):
        odd = empty | (data[safe_start] != _OPEN) | (data[safe_end] != _CLOSE)
    else:
        odd = np.ones(len(starts), dtype=np.bool_)
    breaks = np.flatnonzero((data == _NEWLINE) | (data == _RETURN))
    if len(breaks):
        odd[np.searchsorted(values.offsets, breaks, side="right") - 1] = True
    return np.flatnonzero(odd)


def _not_utf8(values: Binary) -> int | None:
    """The first value that is not UTF-8 (one bulk check; only a failure looks one by one)."""
    offsets = pa.py_buffer(values.offsets.astype(np.int32, copy=False))
    text = pa.Array.from_buffers(
        pa.string(), len(values.valid), [None, offsets, pa.py_buffer(values.data)]
    )
    try:
        text.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    for i in range(len(values.valid)):
        try:
            values.data[values.offsets[i] : values.offsets[i + 1]].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return i
    return None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, no key given twice."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            raise ValueError("a key is given twice")
        return out

    return json.loads(raw.decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=pairs)


def _compact(raw: bytes) -> bytes | str:
    """An odd value's compact one-line form, or why it is not a JSON object."""
    try:
        value = _loads(raw)
    except UnicodeDecodeError:
        return "the value is not UTF-8"
    except ValueError as exc:
        return f"the value is not JSON: {exc}"
    if not isinstance(value, dict):
        return f"the value is not a JSON object (it is {type(value).__name__})"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def to_columns(plan: JsonPlan, values: Binary) -> Typed | Misfit:
    """`values` (JSON texts, one per record) as typed columns, or the first that doesn't fit."""
    n = len(values.valid)
    if not values.valid.all():
        return Misfit(int(np.argmin(values.valid)), "the value is null (a tombstone)")
    bad = _not_utf8(values)
    if bad is not None:  # the JSON reader would take such bytes into a string column
        return Misfit(bad, "the value is not UTF-8")
    replaced: dict[int, bytes] = {}
    for i in _odd_rows(values).tolist():
        raw = values.data[values.offsets[i] : values.offsets[i + 1]].tobytes()
        compact = _compact(raw)
        if isinstance(compact, str):
            return Misfit(i, compact)
        replaced[i] = compact
    lines = _lines(values, replaced)
    line_starts = _line_starts(values, replaced)

    def read(start: int, stop: int, unexpected: str) -> pa.Table:
        lo, hi = int(line_starts[start]), int(line_starts[stop])
        return _read(lines[lo:hi], plan.parse, unexpected)

    def attempt(unexpected: str) -> Callable[[int, int], str | None]:
        def run(start: int, stop: int) -> str | None:
            try:
                rows = read(start, stop, unexpected).num_rows
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                return f"the value does not fit the schema: {_reason(exc)}"
            return None if rows == stop - start else "the value holds more than one JSON document"

        return run

    extras = False
    try:
        table = read(0, n, "infer")
        extras = not table.schema.equals(plan.parse)
    except pa.ArrowInvalid:
        table = None
    if table is None or extras:
        # Extra fields (or ones whose types the reader couldn't agree on): read without them.
        extras = True
        failure = _first_failure(n, attempt("ignore"))
        if failure is not None:
            return Misfit(*failure)
        table = read(0, n, "ignore")
    elif table.num_rows != n:
        failure = _first_failure(n, attempt("ignore"))
        return Misfit(*(failure or (0, "the values hold more JSON documents than records")))
    for name in plan.required:
        column = table.column(name)
        if column.null_count:
            row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
            return Misfit(row, f"required field {name!r} is missing or null")
    for column in table.columns if plan.floats else ():
        odd_numbers = _rows_with_non_finite(column.combine_chunks())
        if odd_numbers.any():
            row = int(np.argmax(odd_numbers))
            return Misfit(row, "a number is NaN or Infinity, which JSON does not have")
    verbatim = np.zeros(n, dtype=np.bool_)
    styles: dict[str, str] = {}
    columns = []
    for f, column in zip(plan.target, table.columns, strict=True):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        converted = _convert(array, f.type, f.name, verbatim, styles)
        if isinstance(converted, Misfit):
            return converted
        columns.append(converted)
    typed = pa.Table.from_arrays(columns, schema=plan.target)
    check = np.ones(n, dtype=np.bool_) if extras else _rows_with_nulls(typed)
    check &= ~verbatim
    omit_nulls = False
    if check.any():
        # Which rows come back equal with nulls left out (omit) or written (write): decided in
        # bulk where the text shows it, by Python's json module only for the rest.
        fits = {False: np.zeros(n, np.bool_), True: np.zeros(n, np.bool_)}
        unknown = check.copy()
        if not extras:
            text = _as_text(values)
            # No `null` anywhere in the text: every null is a field left out.
            fits[True] = check & ~_flags(pc.match_substring(text, "null"))
            fits[False] = check & _only_explicit_nulls(typed, text, plan)
            unknown &= ~(fits[True] | fits[False])
        rows = np.flatnonzero(unknown)
        if len(rows):
            originals = []
            for i in rows.tolist():
                try:
                    originals.append(_loads(_value(values, replaced, i)))
                except ValueError as exc:
                    return Misfit(i, f"the value is not JSON: {exc}")
            subset = typed.take(pa.array(rows))
            for omit in (False, True):
                texts = json_texts(subset, styles, omit).to_pylist()
                fits[omit][rows] = [
                    json.loads(t) == o for t, o in zip(texts, originals, strict=True)
                ]
        omit_nulls = bool(fits[True][check].sum() > fits[False][check].sum())
        verbatim[check & ~fits[omit_nulls]] = True
    return Typed(typed, verbatim, omit_nulls, styles)


def _as_text(values: Binary) -> pa.Array:
    """The values as an Arrow string array (they are checked UTF-8 by then)."""
    offsets = pa.py_buffer(values.offsets.astype(np.int32, copy=False))
    data = pa.py_buffer(values.data)
    return pa.Array.from_buffers(pa.string(), len(values.valid), [None, offsets, data])


def _flags(array: pa.Array) -> Mask:
    return np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _nested_names(kind: pa.DataType, depth: int = 0) -> set[str]:
    names: set[str] = set()
    if pa.types.is_struct(kind):
        for f in kind:
            if depth:
                names.add(f.name)
            names |= _nested_names(f.type, depth + 1)
    elif pa.types.is_list(kind):
        names |= _nested_names(kind.value_type, depth + 1)
    return names


def _only_explicit_nulls(typed: pa.Table, text: pa.Array, plan: JsonPlan) -> Mask:
    """Rows whose every null is a top-level field the text writes as `"name": null`. A name
    that is also a nested field's, or that JSON would escape, is never decided here: the
    pattern could match the nested one."""
    nested = set().union(*(_nested_names(f.type, 1) for f in plan.target))
    ok = np.ones(typed.num_rows, dtype=np.bool_)
    for f in plan.target:
        column = typed.column(f.name).combine_chunks()
        top = _flags(column.is_null()) if column.null_count else np.zeros(len(column), np.bool_)
        if pa.types.is_struct(f.type) or pa.types.is_list(f.type):
            ok &= ~(_null_rows(column) & ~top)  # a null inside: not decided here
        if not top.any():
            continue
        plain = json.dumps(f.name, ensure_ascii=False)[1:-1] == f.name
        if f.name in nested or not plain:
            ok &= ~top
            continue
        pattern = '"' + re.escape(f.name) + r'"\s*:\s*null'
        ok &= ~top | _flags(pc.match_substring_regex(text, pattern))
    return ok


def _line_starts(values: Binary, replaced: dict[int, bytes]) -> npt.NDArray[np.int64]:
    lengths = (values.offsets[1:] - values.offsets[:-1]).astype(np.int64)
    for i, raw in replaced.items():
        lengths[i] = len(raw)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=starts[1:])
    return starts


def _value(values: Binary, replaced: dict[int, bytes], i: int) -> bytes:
    return replaced.get(i) or values.data[values.offsets[i] : values.offsets[i + 1]].tobytes()


def _rows_with_nulls(table: pa.Table) -> Mask:
    rows = np.zeros(table.num_rows, dtype=np.bool_)
    for column in table.columns:
        for chunk_start, chunk in _chunks(column):
            rows[chunk_start : chunk_start + len(chunk)] |= _null_rows(chunk)
    return rows


def _chunks(column: pa.ChunkedArray) -> Iterator[tuple[int, pa.Array]]:
    start = 0
    for chunk in column.chunks:
        yield start, chunk
        start += len(chunk)


def _null_rows(array: pa.Array) -> Mask:
    """Rows of `array` with a null anywhere inside them."""
    kind = array.type
    if array.null_count:
        rows: Mask = np.array(array.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    else:
        rows = np.zeros(len(array), dtype=np.bool_)
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            rows |= _null_rows(array.field(i))
    elif pa.types.is_list(kind):
        inner = _null_rows(array.flatten())
        if inner.any():
            parents = pc.list_parent_indices(array).to_numpy()
            rows[parents[inner]] = True
    return rows


def _rows_with_non_finite(array: pa.Array) -> Mask:
    """Rows of `array` with a NaN or infinite double anywhere inside them."""
    kind = array.type
    if pa.types.is_floating(kind):
        finite = pc.is_finite(array).fill_null(True)
        if pc.all(finite).as_py():
            return np.zeros(len(array), dtype=np.bool_)
        return ~np.asarray(finite.to_numpy(zero_copy_only=False), dtype=np.bool_)
    rows = np.zeros(len(array), dtype=np.bool_)
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            rows |= _rows_with_non_finite(array.field(i))
    elif pa.types.is_list(kind):
        inner = _rows_with_non_finite(array.flatten())
        if inner.any():
            rows[pc.list_parent_indices(array).to_numpy()[inner]] = True
    return rows


def _convert(
    array: pa.Array, kind: pa.DataType, path: str, verbatim: Mask, styles: dict[str, str]
) -> pa.Array | Misfit:
    """`array` (as read: timestamps and dates as text) as `kind`; rows whose text the typed
    value doesn't render back to are marked in `verbatim` (one entry per row of `array`)."""
    if not _has_text_types(kind):
        return array
    if pa.types.is_struct(kind):
        children = []
        for i, child in enumerate(kind):
            converted = _convert(
                array.field(i), child.type, f"{path}.{child.name}", verbatim, styles
            )
            if isinstance(converted, Misfit):
                return converted
            children.append(converted)
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=array.is_null())
    if pa.types.is_list(kind):
        offsets = array.offsets
        values = array.values
        inner = np.zeros(len(values), dtype=np.bool_)
        converted = _convert(values, kind.value_type, f"{path}[]", inner, styles)
        if isinstance(converted, Misfit):
            parent = _parent(offsets, converted.record)
            return Misfit(parent, converted.reason)
        if inner.any():
            starts = offsets.to_numpy()
            verbatim[np.searchsorted(starts, np.flatnonzero(inner), side="right") - 1] = True
        return pa.ListArray.from_arrays(offsets, converted, type=kind, mask=array.is_null())
    return _text_to_time(array, kind, path, verbatim, styles)


def _parent(offsets: pa.Array, child: int) -> int:
    return int(np.searchsorted(offsets.to_numpy(), child, side="right") - 1)


def _text_to_time(
    text: pa.Array, kind: pa.DataType, path: str, verbatim: Mask, styles: dict[str, str]
) -> pa.Array | Misfit:
    try:
        typed = _parse_time(text, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        failure = _first_failure(len(text), lambda a, b: _parse_error(text[a:b], kind))
        row, why = failure or (0, "unreadable")
        return Misfit(row, f"field {path!r}: {why}")
    if pa.types.is_date32(kind):
        back = typed.cast(pa.string())
        differs = _differs(back, text)
    else:
        styles[path], differs = _best_style(typed, text, kind.tz is None)
    verbatim |= differs
    return typed


def _parse_time(text: pa.Array, kind: pa.DataType) -> pa.Array:
    if pa.types.is_date32(kind):
        return text.cast(pa.date32())
    if kind.tz is None:
        return text.cast(pa.timestamp("us"))
    try:
        return text.cast(kind)
    except pa.ArrowInvalid:
        # Without a zone: read as UTC, as the lake's Spark session does.
        return text.cast(pa.timestamp("us")).cast(kind)


def _parse_error(text: pa.Array, kind: pa.DataType) -> str | None:
    try:
        _parse_time(text, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return f"not a {'date' if pa.types.is_date32(kind) else 'timestamp'}: {_reason(exc)}"
    return None


def _differs(rendered: pa.Array, text: pa.Array) -> Mask:
    same = pc.equal(rendered, text)
    # Both null is the same value; a null on one side only can't happen (the parse keeps nulls).
    differs: Mask = ~np.asarray(same.fill_null(True).to_numpy(zero_copy_only=False), np.bool_)
    return differs


def _best_style(typed: pa.Array, text: pa.Array, naive: bool) -> tuple[str, Mask]:
    """The style that renders most of `text` back (tried from what the first value looks like),
    and the rows it doesn't."""
    valid = text.drop_null()
    first: str = valid[0].as_py() if len(valid) else ""
    suffix = "" if naive else next((s for s in _SUFFIXES if first.endswith(s)), "Z")
    dot = first.rfind(".")
    digits = 0
    if dot > 0:
        tail = first[dot + 1 : len(first) - len(suffix)]
        digits = len(tail) if tail.isdigit() else 0
    order = {0: ("t3", "t6", "0"), 3: ("3", "t3"), 6: ("6", "t6")}.get(digits, ("t3", "6"))
    best: tuple[str, Mask] | None = None
    for fraction in order:
        style = fraction + suffix
        differs = _differs(render_time(typed, style), text)
        if not differs.any():
            return style, differs
        if best is None or differs.sum() < best[1].sum():
            best = (style, differs)
    assert best is not None
    return best


def render_time(typed: pa.Array, style: str) -> pa.Array:
    """Timestamps (microseconds) as text in `style` (one of TIMESTAMP_STYLES). Arrow's cast of a
    zoneless timestamp to text ("2026-11-23 09:03:00.250000") is fifty times as fast as its
    strftime, so the text is cut from that."""
    suffix = next(s for s in _SUFFIXES if style.endswith(s))
    fraction = style[: len(style) - len(suffix)]
    naive = typed.cast(pa.timestamp("us")) if typed.type.tz is not None else typed
    full = pc.replace_substring(naive.cast(pa.string()), " ", "T", max_replacements=1)
    if fraction == "6":
        text = full
    elif fraction in ("0", "3"):
        text = pc.utf8_slice_codeunits(full, 0, 19 if fraction == "0" else 23)
    else:
        micros = np.asarray(naive.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        whole = pa.array(micros % 1_000_000 == 0)
        text = pc.if_else(whole, pc.utf8_slice_codeunits(full, 0, 19), full)
        if fraction == "t3":
            millis = pa.array(micros % 1000 == 0)
            text = pc.if_else(
                pc.and_(millis, pc.invert(whole)), pc.utf8_slice_codeunits(full, 0, 23), text
            )
    return pc.binary_join_element_wise(text, suffix, "") if suffix else text


# ---- the way out ----------------------------------------------------------------------------


def json_texts(table: pa.Table, styles: dict[str, str], omit_nulls: bool) -> pa.Array:
    """Each row of `table` (value columns only) as JSON text: a string array, never null."""
    columns = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in table.columns]
    if table.num_rows == 0:
        return pa.array([], pa.string())
    rows = pa.StructArray.from_arrays(columns, fields=list(table.schema))
    return _struct_text(rows, "", styles, omit_nulls)


# What makes a string need escaping in JSON: a quote, a backslash, a control character.
_NEEDS_ESCAPE: Final = r'["\\\x00-\x1f]'


def _escaped(strings: pa.Array) -> pa.Array:
    """Strings as the inside of JSON strings (without the quotes)."""
    if not pc.any(pc.match_substring_regex(strings, _NEEDS_ESCAPE)).as_py():
        return strings
    text = strings
    for raw, escaped in _ESCAPES:
        text = pc.replace_substring(text, raw, escaped)
    odd = pc.match_substring_regex(text, _CONTROL)
    if pc.any(odd).as_py():
        # Rare control characters (\b, \f, \x00 ...): each such string by the json module.
        fixed = [
            json.dumps(s, ensure_ascii=False)[1:-1] if bad else t
            for s, t, bad in zip(
                strings.to_pylist(), text.to_pylist(), odd.to_pylist(), strict=True
            )
        ]
        text = pa.array(fixed, pa.string())
    return text


def _text(array: pa.Array, path: str, styles: dict[str, str], omit_nulls: bool) -> pa.Array:
    """`array` as JSON text, quoted, "null" where null."""
    text, quote = _bare_text(array, path, styles, omit_nulls)
    if quote:
        text = pc.binary_join_element_wise('"', text, '"', "")
    if array.null_count == 0:
        return text
    return pc.if_else(array.is_null(), "null", text)


def _bare_text(
    array: pa.Array, path: str, styles: dict[str, str], omit_nulls: bool
) -> tuple[pa.Array, bool]:
    """`array` as JSON text (nulls undefined), and whether it still needs its quotes."""
    kind = array.type
    if pa.types.is_struct(kind):
        return _struct_text(array, path, styles, omit_nulls), False
    if pa.types.is_list(kind):
        inner = _text(array.values, f"{path}[]", styles, omit_nulls)
        joined = pc.binary_join(pa.ListArray.from_arrays(array.offsets, inner), ",")
        return pc.binary_join_element_wise("[", joined, "]", ""), False
    if pa.types.is_boolean(kind):
        return pc.if_else(array, "true", "false"), False
    if pa.types.is_string(kind):
        return _escaped(array), True
    if pa.types.is_timestamp(kind):
        return render_time(array, styles.get(path, "t3Z" if kind.tz else "t3")), True
    if pa.types.is_date32(kind):
        return array.cast(pa.string()), True
    # Integers, double, decimal128: Arrow writes the shortest text that reads back.
    return array.cast(pa.string()), False


def _struct_text(
    array: pa.StructArray, path: str, styles: dict[str, str], omit_nulls: bool
) -> pa.Array:
    """A struct's rows as JSON objects (nulls undefined): one join over the fields' texts and
    the literal text between them, so each row is written in one pass."""
    pieces: list[str | pa.Array] = ["{"]
    first_may_vanish = False
    for i, f in enumerate(array.type):
        child = array.field(i)
        name = ("," if i else "") + json.dumps(f.name, ensure_ascii=False) + ":"
        where = f"{path}.{f.name}" if path else f.name
        if omit_nulls and child.null_count:
            # Left out where null: each row's piece is its own text, or nothing.
            text = _text(child, where, styles, omit_nulls)
            piece = pc.binary_join_element_wise("," + name.lstrip(","), text, "")
            pieces.append(pc.if_else(child.is_null(), "", piece))
            first_may_vanish = first_may_vanish or i == 0
            continue
        if child.null_count:
            text, quote = _text(child, where, styles, omit_nulls), False
        else:
            text, quote = _bare_text(child, where, styles, omit_nulls)
        pieces += [name + ('"' if quote else ""), text]
        if quote:
            pieces.append('"')
    pieces.append("}")
    merged: list[str | pa.Array] = []
    for piece in pieces:  # adjacent literals as one argument
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    text = pc.binary_join_element_wise(*merged, "")
    if first_may_vanish:
        # Every piece after a field that may be left out starts with a comma; the object's
        # first present one must not.
        text = pc.replace_substring(text, "{,", "{", max_replacements=1)
    return text
