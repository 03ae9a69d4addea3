"""A small valid message of every kio message class, and places in it to corrupt.

`skeleton(cls)` fills every field of a kio entity with a non-default value (one element per
array, a one-byte string, every tagged field present), so its encoding holds every length the
schema has. `bodies()` encodes one per API key, version and direction. `MUTATIONS` are the
hostile lengths written over such a body at each offset: the largest int32 (legacy arrays and
bytes), int16 (legacy strings), negative lengths other than null, and varints for 2**31-1 and
2**32-1 and one longer than Kafka's five bytes (compact lengths, tagged-field counts and sizes).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pkgutil import resolve_name
from types import NoneType, UnionType
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.static.constants import EntityType

_PRIMITIVES: Final[dict[str, Any]] = {
    "string": "x",
    "bytes": b"x",
    "records": b"x",
    "uuid": uuid.UUID(int=1),
    "bool": True,
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(milliseconds=1),
    "timedelta_i64": datetime.timedelta(milliseconds=1),
    "datetime_i64": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
    "float64": 1.0,
}

MUTATIONS: Final[dict[str, tuple[int, bytes]]] = {
    # name: (bytes overwritten, bytes written)
    "int32-max": (4, b"\x7f\xff\xff\xff"),
    "int32-min": (4, b"\x80\x00\x00\x00"),
    "int32-minus-2": (4, b"\xff\xff\xff\xfe"),
    "int16-max": (2, b"\x7f\xff"),
    "int16-minus-2": (2, b"\xff\xfe"),
    "varint-2^31-1": (1, b"\xff\xff\xff\xff\x07"),
    "varint-2^32-1": (1, b"\xff\xff\xff\xff\x0f"),
    "varint-9-bytes": (1, b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f"),
}


@dataclass(frozen=True)
class Body:
    api_key: int
    api_version: int
    kind: str  # "request" or "response"
    path: str  # kio's "module:Class"
    data: bytes

    def __str__(self) -> str:
        return f"{api_key_map[self.api_key]} v{self.api_version} {self.kind}"


def _unwrap(hint: Any) -> Any:
    if typing.get_origin(hint) in (UnionType, typing.Union):
        return next(a for a in typing.get_args(hint) if a is not NoneType)
    return hint


def skeleton(cls: Any) -> Any:
    """An instance of kio entity `cls` with every field set (arrays of one element)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = _unwrap(hints[f.name])
        array = typing.get_origin(hint) is tuple
        inner = _unwrap(typing.get_args(hint)[0]) if array else hint
        if dataclasses.is_dataclass(inner):
            value = skeleton(inner)
        else:
            value = _PRIMITIVES.get(f.metadata["kafka_type"])
            if value is None:
                value = inner(1)
        values[f.name] = (value,) if array else value
    return cls(**values)


def encode(message: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(message))(out, message)
    return out.getvalue()


@cache
def bodies(apis: frozenset[int] | None = None) -> tuple[Body, ...]:
    """One skeleton body per API key (of `apis`, default all), version and direction that kio
    knows."""
    found = []
    for api_key, name in sorted(api_key_map.items()):
        if apis is not None and api_key not in apis:
            continue
        for version, kinds in sorted(schema_name_map[name].items()):
            for kind in (EntityType.request, EntityType.response):
                path = kinds.get(kind)
                if path is None:
                    continue
                data = encode(skeleton(resolve_name(path)))
                found.append(Body(api_key, version, kind.name, path, data))
    return tuple(found)


def mutate(data: bytes, offset: int, mutation: str) -> bytes:
    width, written = MUTATIONS[mutation]
    return data[:offset] + written + data[offset + width :]


def mutants(body: Body) -> Iterator[tuple[str, int, bytes]]:
    """(mutation, offset, bytes) for every mutation at every offset of a body."""
    for offset in range(len(body.data)):
        for name, (width, _written) in MUTATIONS.items():
            if offset + width <= len(body.data):
                yield name, offset, mutate(body.data, offset, name)
