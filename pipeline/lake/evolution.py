"""Whether a table's schema can become the schema file's, and what that changes.

The lake's Iceberg tables take their schema from the schema file. When the file changes, the
table follows only where every row already written still reads correctly:

- a new optional field, anywhere (top level, or inside a struct, also in a list): added;
- a required field becoming optional: relaxed;
- int to bigint and float to double: widened (Iceberg's type promotions).

Anything else is refused, every problem named, before anything is written: a field the file
no longer has (dropping a column loses its data), a new required field (the rows written have
no value for it), an optional field becoming required, and any other change of type. Compared
as Arrow schemas (what the Iceberg table reads as, and what Spark's rows are), by name. Plain
data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa

__all__ = ["Evolution", "SchemaChangeRefused", "plan_evolution"]

_WIDENINGS: Final = {("int32", "int64"), ("float", "double")}


class SchemaChangeRefused(ValueError):
    """The schema file asks for a change the table can't take without losing or misreading
    data."""


@dataclass(frozen=True)
class Evolution:
    added: list[str] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.added or self.relaxed or self.widened)

    def describe(self) -> str:
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("made optional", self.relaxed),
                ("widened", self.widened),
            )
            if names
        ]
        return "; ".join(parts) or "no change"


def plan_evolution(table: pa.Schema, wanted: pa.Schema, name: str) -> Evolution:
    """What turning `table`'s schema into `wanted` changes; SchemaChangeRefused listing every
    problem if it can't be done safely."""
    evolution = Evolution()
    problems: list[str] = []
    _fields(list(table), list(wanted), "", evolution, problems)
    if problems:
        raise SchemaChangeRefused(
            f"table {name}: the schema file asks for changes that would lose or misread the "
            f"rows already written: {'; '.join(problems)}. Only new optional fields, required "
            "fields made optional, and int to bigint or float to double are applied; for "
            "anything else write to a new table (--table)"
        )
    return evolution


def _fields(
    have: list[pa.Field], want: list[pa.Field], path: str, out: Evolution, problems: list[str]
) -> None:
    wanted = {f.name: f for f in want}
    for old in have:
        where = f"{path}{old.name}"
        new = wanted.pop(old.name, None)
        if new is None:
            problems.append(
                f"field {where!r} is not in the schema file (dropping it loses its data)"
            )
            continue
        if old.nullable and not new.nullable:
            problems.append(f"field {where!r} would become required (rows written may lack it)")
        elif new.nullable and not old.nullable:
            out.relaxed.append(where)
        _types(old.type, new.type, where, out, problems)
    for new in wanted.values():
        where = f"{path}{new.name}"
        if not new.nullable:
            problems.append(f"new field {where!r} is required (the rows written have no value)")
        else:
            out.added.append(where)


def _types(
    old: pa.DataType, new: pa.DataType, where: str, out: Evolution, problems: list[str]
) -> None:
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        _fields(list(old), list(new), f"{where}.", out, problems)
        return
    if _is_list(old) and _is_list(new):
        _types(old.value_type, new.value_type, f"{where}[]", out, problems)
        return
    before, after = _shape(old), _shape(new)
    if before == after:
        return
    if (before, after) in _WIDENINGS:
        out.widened.append(where)
        return
    problems.append(f"field {where!r} would change type from {before} to {after}")


def _is_list(kind: pa.DataType) -> bool:
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind))


def _shape(kind: pa.DataType) -> str:
    """A type's name for comparing: Arrow's large and small variants alike, time zones as UTC
    or none."""
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return "binary"
    if pa.types.is_timestamp(kind):
        return "timestamptz" if kind.tz else "timestamp"
    if pa.types.is_struct(kind):
        return "struct"
    if _is_list(kind):
        return "list"
    return str(kind)
