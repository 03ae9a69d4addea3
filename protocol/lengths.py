"""Every length a kio message claims, checked against the bytes left before kio reads it.

kio's native reader (Rust) reserves room for an array as soon as it has read the array's count:
`Vec::with_capacity(count)`, eight bytes per element, before reading one element. A count is
an int32 (up to 2**31-1: 16 GiB reserved) or, in flexible versions, an unsigned varint (up to
2**35-1: 256 GiB). When the allocator refuses, Rust aborts the whole process: no exception, no
`finally`, every client connection gone. Which counts abort depends on the machine (here the
kernel's overcommit grants 16 GiB and refuses 32 GiB; under a 4 GiB address-space limit, as
with `ulimit -v`, 16 GiB aborts too), so every count is checked, in every message kipside
decodes with kio.

`check_lengths` walks a message body the way kio will, from the same schema (kio's generated
dataclasses and their field metadata), and raises DecodeError at the first count the bytes
left cannot hold (`count * smallest element > bytes left`: Apache Kafka's generated readers
refuse the same, "Tried to read N elements, but only M bytes remain"), at a string or bytes
length past the end, at a negative length other than -1 (null), at a tagged-field count the
bytes left cannot hold, and at an unknown tagged field whose size runs past the end (a known
one is walked by its schema, as kio reads it). Once it passes, kio reserves at most 8 bytes per
byte left in the frame for any array, and reads no further than the walk did.

The walk is compiled once per message class into one Python function (source generated from
the schema, the way kio and Kafka generate their readers): fixed-size fields add up to one
addition, an array of fixed-size elements costs one multiplication however long it is, and the
usual one-byte lengths and empty tagged-field sections are read inline. A message with no
array anywhere in its schema is not walked at all. Sans-I/O; nothing here allocates in
proportion to a length it has not checked.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable
from functools import cache
from types import NoneType, UnionType
from typing import Any, Final, NoReturn, cast

from .errors import DecodeError
from .primitives import INT16, INT32, Buffer, read_uvarint

__all__ = ["check_lengths", "compile_check"]

Check = Callable[[Buffer, int, int], int]
"""(buffer, offset, end) -> the offset after the value; raises DecodeError."""

# Bytes of each fixed-width kio kafka_type.
_FIXED: Final = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE: Final = frozenset({"string", "bytes", "records"})


def check_lengths(cls: Any, buf: Buffer, offset: int) -> None:
    """Raise DecodeError if a length in the body of kio message `cls` starting at `offset`
    runs past the end of `buf` (see the module docstring)."""
    check = compile_check(cls)
    if check is not None:
        check(buf, offset, len(buf))


@cache
def compile_check(cls: Any) -> Check | None:
    """The compiled walk of one kio message class; None when its schema holds no array."""
    writer = _Writer()
    writer.entity(cls, nullable=False, depth=1)
    writer.flush(1)
    return writer.function(cls.__name__) if writer.has_array else None


# What the generated code calls on its slow and failing paths.


def _too_many(where: str, count: int, smallest: int, left: int) -> NoReturn:
    raise DecodeError(
        f"{where} claims {count} elements of at least {smallest} bytes, "
        f"but only {max(left, 0)} bytes are left"
    )


def _negative(where: str, length: int) -> NoReturn:
    raise DecodeError(f"{where} has the negative length {length}")


def _overrun(where: str, pos: int, end: int) -> NoReturn:
    raise DecodeError(f"{where} runs {pos - end} bytes past the end of the message")


def _tagged(
    where: str, known: dict[int, tuple[str, Check]], buf: Buffer, pos: int, end: int
) -> int:
    """A tagged-field section that is not empty. A known tag's value is walked from its
    schema and the walk goes on where the value ends, as kio and Kafka's generated readers
    read it (neither looks at a known tag's declared size); an unknown one is skipped by its
    size, which must fit (kio then refuses it: protocol.messages)."""
    count, pos = read_uvarint(buf, pos)
    if count > (end - pos) // 2:  # each field takes a tag and a size at least
        raise DecodeError(
            f"{where} claims {count} tagged fields, but only {max(end - pos, 0)} bytes are left"
        )
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        field = known.get(tag)
        if field is not None:
            pos = field[1](buf, pos, end)
        elif pos + size > end:
            raise DecodeError(
                f"{where} tagged field {tag} claims {size} bytes, "
                f"but only {max(end - pos, 0)} are left"
            )
        else:
            pos += size
    return pos


_HELPERS: Final[dict[str, object]] = {
    "_I16": INT16.unpack_from,
    "_I32": INT32.unpack_from,
    "_uvarint": read_uvarint,
    "_too_many": _too_many,
    "_negative": _negative,
    "_overrun": _overrun,
    "_tagged": _tagged,
    "DecodeError": DecodeError,
    "StructError": struct.error,
}


def _without_none(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (UnionType, typing.Union):
        return next(a for a in typing.get_args(hint) if a is not NoneType), True
    return hint, False


class _Writer:
    """Writes the source of one check function: `pos` walks `buf` up to `end`. Writers of
    nested parts (an array's element) share their parent's names."""

    def __init__(self, parent: _Writer | None = None) -> None:
        self.lines: list[str] = []
        self.names: dict[str, object] = parent.names if parent is not None else {}
        self.has_array = False
        self._pending = 0  # fixed-size bytes not yet added to pos

    def function(self, name: str) -> Check:
        body = "\n".join(self.lines) or "        pass"
        source = (
            f"def check_{name}(buf, pos, end):\n"
            f"    try:\n{body}\n"
            f"    except (IndexError, StructError):\n"
            f"        raise DecodeError('{name} is truncated') from None\n"
            f"    return pos\n"
        )
        namespace = {**_HELPERS, **self.names}
        exec(compile(source, f"<kipside.protocol.lengths: {name}>", "exec"), namespace)
        return cast(Check, namespace[f"check_{name}"])

    def _emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * (depth + 1) + line)

    def flush(self, depth: int) -> None:
        if self._pending:
            self._emit(depth, f"pos += {self._pending}")
            self._pending = 0

    def _name(self, prefix: str, value: object = None) -> str:
        name = f"{prefix}{len(self.names)}"
        self.names[name] = value
        return name

    def entity(self, cls: Any, *, nullable: bool, depth: int) -> None:
        if nullable:  # KIP-893: an int8 marker, -1 (0xff) for null, then the struct
            self.flush(depth)
            self._emit(depth, "if buf[pos] == 0xFF:")
            self._emit(depth + 1, "pos += 1")
            self._emit(depth, "else:")
            self._emit(depth + 1, "pos += 1")
            depth += 1
        hints = typing.get_type_hints(cls)
        owner = cls.__name__
        known: dict[int, tuple[str, Check]] = {}
        written = len(self.lines)
        for f in dataclasses.fields(cls):
            tag = f.metadata.get("tag")
            if tag is not None:
                known[tag] = (f.name, self._tagged_value(cls, f, hints[f.name]))
            else:
                self.field(owner, f, hints[f.name], cls.__flexible__, depth)
        if len(self.lines) == written and not cls.__flexible__:
            return  # fixed-size: its bytes stay pending, counted with whatever follows
        self.flush(depth)
        where = self._name("W", owner)
        self._emit(depth, f"if pos > end: _overrun({where}, pos, end)")
        if cls.__flexible__:
            tags = self._name("T", known)
            self._emit(depth, "if buf[pos] == 0:")
            self._emit(depth + 1, "pos += 1")
            self._emit(depth, "else:")
            self._emit(depth + 1, f"pos = _tagged({where}, {tags}, buf, pos, end)")

    def _tagged_value(self, cls: Any, f: dataclasses.Field[Any], hint: Any) -> Check:
        """A tagged field's value, walked by a function of its own (the rare path)."""
        writer = _Writer()
        writer.field(cls.__name__, f, hint, True, depth=1, tagged=True)
        writer.flush(1)
        self.has_array = self.has_array or writer.has_array
        return writer.function(f"{cls.__name__}_{f.name}")

    def field(
        self,
        owner: str,
        f: dataclasses.Field[Any],
        hint: Any,
        flexible: bool,
        depth: int,
        *,
        tagged: bool = False,
    ) -> None:
        where = f"{owner}.{f.name}"
        inner, optional = _without_none(hint)
        if typing.get_origin(inner) is tuple:
            element = _without_none(typing.get_args(inner)[0])[0]
            self.array(where, f, element, flexible, depth)
        elif dataclasses.is_dataclass(inner):
            # kio reads a tagged struct as present (its tag is its presence): no marker.
            self.entity(inner, nullable=optional and not tagged, depth=depth)
        else:
            self.primitive(where, f.metadata["kafka_type"], flexible, depth)

    def primitive(self, where: str, kind: str, flexible: bool, depth: int) -> None:
        size = _FIXED.get(kind)
        if size is not None:
            self._pending += size
            return
        if kind not in _VARIABLE:
            raise DecodeError(f"{where}: kipside cannot check the kio type {kind!r}")
        self.flush(depth)
        if flexible:  # uvarint N+1, 0 for null; one byte unless N >= 127
            self._emit(depth, "n = buf[pos]")
            self._emit(depth, "if n < 0x80:")
            self._emit(depth + 1, "pos += n or 1")
            self._emit(depth, "else:")
            self._emit(depth + 1, "n, pos = _uvarint(buf, pos)")
            self._emit(depth + 1, "if n: pos += n - 1")
            return
        width, unpack = (2, "_I16") if kind == "string" else (4, "_I32")
        self._emit(depth, f"n = {unpack}(buf, pos)[0]")
        self._emit(depth, f"pos += {width}")
        self._emit(depth, "if n > 0:")
        self._emit(depth + 1, "pos += n")
        self._emit(depth, "elif n < -1:")
        self._emit(depth + 1, f"_negative({self._name('W', where)}, n)")

    def array(
        self, where: str, f: dataclasses.Field[Any], element: Any, flexible: bool, depth: int
    ) -> None:
        self.has_array = True
        self.flush(depth)
        count = self._name("c")
        if flexible:  # uvarint N+1, 0 for null
            self._emit(depth, f"{count} = buf[pos]")
            self._emit(depth, f"if {count} < 0x80:")
            self._emit(depth + 1, "pos += 1")
            self._emit(depth, "else:")
            self._emit(depth + 1, f"{count}, pos = _uvarint(buf, pos)")
            self._emit(depth, f"{count} -= 1")
        else:
            self._emit(depth, f"{count} = _I32(buf, pos)[0]")
            self._emit(depth, "pos += 4")
            self._emit(depth, f"if {count} < -1:")
            self._emit(depth + 1, f"_negative({self._name('W', where)}, {count})")
        smallest = max(_smallest(element, f, flexible), 1)
        label = self._name("W", where)
        self._emit(depth, f"if {count} > 0:")
        self._emit(
            depth + 1,
            f"if {count} * {smallest} > end - pos: "
            f"_too_many({label}, {count}, {smallest}, end - pos)",
        )
        each = _Writer(self)
        if dataclasses.is_dataclass(element):
            each.entity(element, nullable=False, depth=depth + 2)
        else:
            each.primitive(where, f.metadata["kafka_type"], flexible, depth + 2)
        if not each.lines:  # fixed-size elements: one multiplication
            self._emit(depth + 1, f"pos += {count} * {each._pending}")
            return
        each.flush(depth + 2)
        self._emit(depth + 1, f"for _ in range({count}):")
        self.lines.extend(each.lines)
        self.has_array = self.has_array or each.has_array


def _smallest(hint: Any, f: dataclasses.Field[Any], flexible: bool) -> int:
    """The fewest bytes one value of this schema type can take (an empty array, a null string,
    no tagged fields)."""
    if dataclasses.is_dataclass(hint):
        return _smallest_entity(hint)
    kind = f.metadata["kafka_type"]
    return _FIXED.get(kind, 1 if flexible else (2 if kind == "string" else 4))


def _smallest_entity(cls: Any) -> int:
    hints = typing.get_type_hints(cls)
    flexible: bool = cls.__flexible__
    total = 1 if flexible else 0  # the tagged-field count
    for f in dataclasses.fields(cls):
        if f.metadata.get("tag") is not None:
            continue
        inner, optional = _without_none(hints[f.name])
        if typing.get_origin(inner) is tuple:
            total += 1 if flexible else 4
        elif dataclasses.is_dataclass(inner) and optional:
            total += 1
        else:
            total += _smallest(inner, f, flexible)
    return total
