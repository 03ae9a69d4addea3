"""The one adapter between kipside and kio's generated message classes.

kipside decodes only the messages a feature must read or rewrite; everything else stays bytes.
kio's failure modes are folded into DecodeError here, so no caller ever sees them raw: an unknown
tagged field raises a bare KeyError inside kio, versions Kafka 4.0 removed are simply absent
(UnknownEntity), and truncated input surfaces as ValueError/IndexError/struct errors. Callers then
decide to pass the bytes through or fail clearly. Every body is first walked by
protocol.lengths, because kio's native reader aborts the process on an array count it cannot
allocate. Never does I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import struct
import typing
from functools import cache
from pkgutil import resolve_name
from typing import Any

from kio.schema.index import PayloadEntityType, api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from .apis import api_name
from .errors import DecodeError
from .lengths import check_lengths

KIO_DECODE_ERRORS = (
    SerialError,
    KeyError,
    ValueError,
    IndexError,
    TypeError,
    struct.error,
    UnicodeDecodeError,
)
"""What kio's readers raise for malformed input; `decode` folds each into DecodeError."""

# kio's entities are generated dataclasses without a common nominal base that mypy can use
# for attribute access, so they are typed as Any at this boundary only.
Message = Any


@cache
def _message_class(api_key: int, api_version: int, kind: PayloadEntityType) -> Any:
    name = api_key_map.get(api_key)
    if name is None:
        raise DecodeError(f"kipside has no schema for api key {api_key}")
    try:
        path = schema_name_map[name][api_version][kind]
    except KeyError:
        raise DecodeError(
            f"kipside has no schema for {api_name(api_key)} v{api_version} {kind.name}"
        ) from None
    return resolve_name(path)


def known_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) versions kio can decode for an API, or None."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = schema_name_map[name]
    return min(versions), max(versions)


def _decode(
    api_key: int, api_version: int, kind: PayloadEntityType, buf: bytes, offset: int
) -> Message:
    cls = _message_class(api_key, api_version, kind)
    # Before kio: its native reader reserves memory for an array from the count alone, and
    # aborts the process when the allocation fails (protocol.lengths).
    try:
        check_lengths(cls, buf, offset)
    except DecodeError as exc:
        what = f"{api_name(api_key)} v{api_version} {kind.name}"
        raise DecodeError(f"cannot decode {what}: {exc}") from None
    try:
        message, size = entity_reader(cls)(buf, offset)
    except KIO_DECODE_ERRORS as exc:
        raise DecodeError(
            f"cannot decode {api_name(api_key)} v{api_version} {kind.name}: {exc!r}"
        ) from exc
    if offset + size != len(buf):
        raise DecodeError(
            f"{api_name(api_key)} v{api_version} {kind.name} has {len(buf) - offset - size} "
            "trailing bytes"
        )
    return message


def decode_response(api_key: int, api_version: int, frame: bytes, body_offset: int) -> Message:
    """Decode a response body that starts at body_offset and runs to the end of frame."""
    return _decode(api_key, api_version, EntityType.response, frame, body_offset)


def decode_request(api_key: int, api_version: int, frame: bytes, body_offset: int) -> Message:
    return _decode(api_key, api_version, EntityType.request, frame, body_offset)


def encode_message(message: Message) -> bytes:
    """Encode a kio message body (no header, no size prefix)."""
    out = io.BytesIO()
    entity_writer(type(message))(out, message)
    return out.getvalue()


def response_class(api_key: int, api_version: int) -> Any:
    return _message_class(api_key, api_version, EntityType.response)


def request_class(api_key: int, api_version: int) -> Any:
    return _message_class(api_key, api_version, EntityType.request)


def _entity_class(hint: Any) -> type | None:
    """The entity class of a field hint that holds a kio entity or a tuple of them."""
    while True:
        origin = typing.get_origin(hint)
        if origin is tuple:
            hint = typing.get_args(hint)[0]
        elif origin is not None:  # Optional[...] and other unions
            options = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(options) != 1:
                return None
            hint = options[0]
        else:
            return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def build(cls: Any, fields: dict[str, Any]) -> Message:
    """A kio entity from plain values: nested entities as dicts, arrays as lists.

    Keys the class doesn't have at this version are left out, so one description serves every
    version (a field Kafka added later is simply not sent to an older broker). Durations go in
    as milliseconds.
    """
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in fields:
            continue
        value = fields[f.name]
        hint = hints[f.name]
        nested = _entity_class(hint)
        if nested is not None and isinstance(value, list | tuple):
            value = tuple(build(nested, v) if isinstance(v, dict) else v for v in value)
        elif nested is not None and isinstance(value, dict):
            value = build(nested, value)
        elif _is_timedelta(hint) and isinstance(value, int):
            value = datetime.timedelta(milliseconds=value)
        elif _is_int_enum(hint) and isinstance(value, int) and not isinstance(value, hint):
            # kio writes error codes through the enum (`.value`): a bare int fails to encode.
            value = hint(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


def _is_timedelta(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, datetime.timedelta)


def _is_int_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.IntEnum)


def build_request(api_key: int, api_version: int, fields: dict[str, Any]) -> Message:
    """A request of this API and version from plain values (see `build`)."""
    return build(request_class(api_key, api_version), fields)
