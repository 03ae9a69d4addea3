"""The key file of columnar field encryption: master keys by id, and which one new segments use.

    # keys.yaml: keep it secret (chmod 600); whoever holds it reads the encrypted fields
    write_key: orders-2026
    keys:
      orders-2026: 3q2+7wAAAAAAAAAAAAAAAA==   # base64 of 16, 24 or 32 random bytes (AES)
      orders-2025: ...                         # older keys stay, so older segments still decrypt

Parquet modular encryption encrypts each column with a fresh data key; a master key from this
file wraps that data key, and the wrapped key travels in the Parquet footer with the id of the
master key (docs/columnar.md, "Field encryption", gives the wrapping so other readers can unwrap
it). Rotating is adding a key and pointing `write_key` at it.

Pure: text in, model out (the caller reads the file). The key bytes are never in a repr or an
error message.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

__all__ = ["KEY_SIZES", "ColumnarKeyFileError", "ColumnarKeys"]

KEY_SIZES: Final = (16, 24, 32)
_KEY_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class ColumnarKeyFileError(ValueError):
    """The key file can't be used; the message starts with FILE:LINE. `line` is that line."""

    def __init__(self, message: str, *, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class ColumnarKeys:
    """Master keys by id; `write_key` is the id new segments are encrypted with."""

    write_key: str
    source: str
    _keys: tuple[tuple[str, bytes], ...] = field(repr=False)

    @classmethod
    def of(cls, keys: dict[str, bytes], write_key: str, source: str = "<keys>") -> ColumnarKeys:
        """Keys given in code (tests, tools); checked as a file's would be."""
        for key_id, key in keys.items():
            if _KEY_ID.fullmatch(key_id) is None or len(key) not in KEY_SIZES:
                raise ValueError(
                    f"key {key_id!r}: ids are 1-128 of A-Z a-z 0-9 . _ : -, keys 16, 24 or 32 bytes"
                )
        if write_key not in keys:
            raise ValueError(f"write_key {write_key!r} is not one of the keys")
        return cls(write_key, source, tuple(sorted(keys.items())))

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id for key_id, _ in self._keys)

    def key(self, key_id: str) -> bytes | None:
        """The master key of that id, or None if this file doesn't hold it."""
        return dict(self._keys).get(key_id)

    @classmethod
    def parse(cls, text: str, source: str) -> ColumnarKeys:
        """A key file's text (YAML); `source` names it in messages."""
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise _fail(source, line, f"not valid YAML: {problem}") from None
        if root is None:
            raise _fail(source, 1, "the key file is empty; it needs write_key and keys")
        top = _mapping(source, root, "the key file")
        for name, (key_node, _) in top.items():
            if name not in ("write_key", "keys"):
                raise _fail(
                    source,
                    _line(key_node),
                    f"unknown key {name!r}; a key file has write_key and keys",
                )
        if "keys" not in top:
            raise _fail(source, _line(root), "no keys: list them as `keys: {ID: BASE64, ...}`")
        keys: dict[str, bytes] = {}
        for key_id, (id_node, value) in _mapping(source, top["keys"][1], "keys").items():
            if _KEY_ID.fullmatch(key_id) is None:
                raise _fail(
                    source,
                    _line(id_node),
                    f"key id {key_id!r}: use 1 to 128 of the characters A-Z a-z 0-9 . _ : -",
                )
            keys[key_id] = _key_bytes(source, key_id, value)
        if not keys:
            raise _fail(source, _line(top["keys"][1]), "keys lists no key")
        if "write_key" not in top:
            raise _fail(
                source, _line(root), "no write_key: name the key new segments are encrypted with"
            )
        write_node = top["write_key"][1]
        write_key = write_node.value if isinstance(write_node, ScalarNode) else None
        if write_key not in keys:
            raise _fail(
                source,
                _line(write_node),
                f"write_key {write_key!r} is not one of the keys ({', '.join(sorted(keys))})",
            )
        return cls(str(write_key), source, tuple(sorted(keys.items())))


def _fail(source: str, line: int, message: str) -> ColumnarKeyFileError:
    return ColumnarKeyFileError(f"{source}:{line}: {message}", line=line)


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _mapping(source: str, node: Node, what: str) -> dict[str, tuple[Node, Node]]:
    if not isinstance(node, MappingNode):
        raise _fail(source, _line(node), f"{what} must be a mapping")
    out: dict[str, tuple[Node, Node]] = {}
    for key, value in node.value:
        if not isinstance(key, ScalarNode):
            raise _fail(source, _line(key), f"{what} has a key that is not text")
        if key.value in out:
            raise _fail(source, _line(key), f"{what} has {key.value!r} twice")
        out[str(key.value)] = (key, value)
    return out


def _key_bytes(source: str, key_id: str, node: Node) -> bytes:
    # Never echo the value: it is (or is meant to be) a secret.
    text = node.value if isinstance(node, ScalarNode) and node.style in (None, "'", '"') else None
    if not isinstance(text, str):
        raise _fail(source, _line(node), f"key {key_id!r}: expected base64 text")
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _fail(source, _line(node), f"key {key_id!r}: not valid base64") from None
    if len(key) not in KEY_SIZES:
        raise _fail(
            source,
            _line(node),
            f"key {key_id!r}: {len(key)} bytes; an AES key is 16, 24 or 32 bytes "
            "(e.g. `openssl rand -base64 32`)",
        )
    return key
