"""Kafka messages built from nothing but their class: for answers a proxy writes itself.

`blank(cls, **values)` is a kio entity with the values given and every other field at its
default, or at Kafka's "unknown" (-1, "", empty, null) where the schema has none; keys the class
lacks at its version are ignored, and ints are accepted for error codes. `field_entity` is the
entity class a field holds (itself, or the items of its tuple).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import types
import typing
from typing import Any

from kipside.protocol.messages import Message

__all__ = ["blank", "field_entity"]


def field_entity(cls: Any, name: str) -> Any:
    """The kio entity class a field of `cls` holds (itself, or the items of its tuple)."""
    hint = typing.get_type_hints(cls)[name]
    while (origin := typing.get_origin(hint)) is not None:
        args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
        if origin not in (tuple, typing.Union, types.UnionType) or len(args) != 1:
            break
        hint = args[0]
    if not dataclasses.is_dataclass(hint):
        raise TypeError(f"{cls.__name__}.{name} holds no entity")
    return hint


def _unknown(hint: Any) -> Any:
    """Kafka's "nothing known" for a field without a default."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        return None
    if hint is bool:
        return False
    if hint is str:
        return ""
    if hint is bytes:
        return b""
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return hint(0)
    if isinstance(hint, type) and issubclass(hint, datetime.timedelta):
        return datetime.timedelta(0)
    if isinstance(hint, type) and issubclass(hint, int):
        return -1
    if dataclasses.is_dataclass(hint):
        return blank(hint)
    raise TypeError(f"no blank value for {hint!r}")


def blank(cls: Any, **values: Any) -> Message:
    """An entity of `cls` from `values`, every other field at its default or unknown."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if f.name in values:
            value = values[f.name]
            if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
                value = hint(value)
            kwargs[f.name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _unknown(hint)
    return cls(**kwargs)
