"""Kafka client property files, as the Kafka tools and MirrorMaker 2 take them.

`--source-config FILE` / `--dest-config FILE` hold Kafka client configs one per line
(`security.protocol=SASL_SSL`), in Java's .properties syntax: `key=value`, `key: value` or
`key value`; `#` and `!` start comments; a line ending in a backslash goes on; `\\` escapes.
The file is read and checked when the command starts: an unknown key is an error naming the
file and line (a typo must not silently turn TLS off), and so is a TLS or SASL setting that
can't be used.

What it must never do: show a secret's value. `ClientProperties` prints its keys only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .client import ClientConfig
from .retry import RetryPolicy
from .security import SECURITY_CONFIGS, Security, SecurityConfigError, parse_security

__all__ = [
    "FILE_CONFIGS",
    "ClientProperties",
    "PropertiesError",
    "client_config",
    "load_properties",
]

FILE_CONFIGS: Final = SECURITY_CONFIGS | {
    "bootstrap.servers",
    "client.id",
    "receive.message.max.bytes",
}
"""The configs a property file may hold: who the client is to the cluster, and where it is."""
_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class PropertiesError(ValueError):
    """The file can't be read or says something kipside can't use; the message names the file
    and line."""


@dataclass(frozen=True)
class ClientProperties:
    """Kafka client configs read from a file (keys without any prefix)."""

    path: str
    values: Mapping[str, str] = field(repr=False)

    def __repr__(self) -> str:
        return f"ClientProperties({self.path!r}, keys={sorted(self.values)})"

    def __hash__(self) -> int:
        return hash((self.path, tuple(sorted(self.values.items()))))

    def prefixed(self, prefix: str, *, without: frozenset[str] = frozenset()) -> dict[str, str]:
        """The configs as options named `prefix` + key (Spark's `kafka.` convention)."""
        return {prefix + k: v for k, v in self.values.items() if k not in without}

    @property
    def bootstrap(self) -> str | None:
        return self.values.get("bootstrap.servers")

    def security(self) -> Security:
        """The TLS and SASL settings (checked when the file was loaded)."""
        return parse_security(self.values, lambda key: f"{self.path}: {key}")

    @property
    def hint(self) -> str:
        """Where a failed login's message sends the user."""
        return f"sasl.jaas.config of {self.path}"


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with continuations joined and comments dropped."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip() if pending else raw.strip()
        if not pending:
            start = number
            if not line or line[0] in "#!":
                continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    out.append(chr(int(text[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """Java's rule: the key ends at the first unescaped '=', ':' or whitespace."""
    i = 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        if line[i] in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def load_properties(path: str) -> ClientProperties:
    """Read and check a client property file (see the module doc)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise PropertiesError(f"{path}: cannot read it: {why}") from None
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, line in _logical_lines(text):
        key, value = _split(line)
        if key not in FILE_CONFIGS:
            close = difflib.get_close_matches(key, sorted(FILE_CONFIGS), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise PropertiesError(
                f"{path}:{number}: {key} is not a setting kipside reads from this file ({hint}it "
                "reads bootstrap.servers, client.id, receive.message.max.bytes, "
                "security.protocol, sasl.* and ssl.*)"
            )
        if key in values:
            raise PropertiesError(
                f"{path}:{number}: {key} is set twice (also on line {lines[key]})"
            )
        values[key] = value
        lines[key] = number
    try:
        parse_security(values, lambda key: f"{path}:{lines.get(key, '-')}: {key}")
    except SecurityConfigError as exc:
        raise PropertiesError(str(exc)) from None
    return ClientProperties(path, values)


def client_config(
    properties: ClientProperties | None, client_id: str, timeout_ms: int
) -> ClientConfig:
    """The client settings of a command's cluster: its property file's, if it has one."""
    retry = RetryPolicy(timeout_ms=timeout_ms)
    if properties is None:
        return ClientConfig(client_id=client_id, retry=retry)
    return ClientConfig(
        client_id=properties.values.get("client.id", client_id),
        retry=retry,
        security=properties.security(),
        settings_hint=properties.hint,
    )
