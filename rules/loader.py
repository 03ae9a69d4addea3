"""Reading and checking kipside rule files (YAML) into the :mod:`kipside.rules.model`.

Two steps. :mod:`kipside.rules.yaml_tree` reads the text into plain data that remembers
each value's line (and refuses duplicate keys and alias bombs). Then pydantic checks that
data against the model's own types, section by section, so every problem in the file is
found in one pass. This module turns pydantic's errors into the operator's
``FILE:LINE: KEY: MESSAGE`` lines: the "expected ..." comes from the field's type and
bounds, the default to fall back on from the field's default, so neither is written here.
A model is only returned for a file with no problems.

A rule file may name other files: a columnar rule's schema file and key file. They are read
(through ``read_file``, relative to the rule file's folder) once the file itself is valid, and
a problem in one is reported at the key that names it, with the named file's own FILE:LINE.

This module must never use an unsafe YAML loader, never do I/O other than reading the rule
file and the files it names, and never import trio, sockets, ``kipside.proxy`` or
``kipside.pipeline``.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from yaml.nodes import ScalarNode

from kipside.protocol import (
    ColumnarKeyFileError,
    ColumnarKeys,
    ValueSchemaError,
    check_columnar_schema,
    columnar_missing,
    parse_value_schema,
)
from kipside.rules.errors import FILE_KEY, NO_LINE, RuleError, RuleProblem
from kipside.rules.model import (
    CoalescingRule,
    CoalescingRules,
    ColumnarEncryption,
    ColumnarRule,
    HoldBegin,
    Limits,
    PrincipalRule,
    RuleSet,
    TopicRule,
    Tracing,
    TransactionOutput,
    TransactionRule,
    rules_version,
)
from kipside.rules.yaml_tree import (
    Document,
    Marker,
    Path,
    Tagged,
    describe,
    got,
    line_of,
    read_document,
    short_tag,
    yaml_text,
)

__all__ = ["default_rules", "load_rules", "parse_rules"]

# What a mapping is, for "expected ..." messages; {keys} is filled in from the model.
_MAPPINGS: dict[type, str] = {
    RuleSet: "a mapping with the sections {keys}",
    Limits: "a mapping of limits",
    CoalescingRules: "a mapping of coalescing settings",
    CoalescingRule: "a rule mapping with keys {keys}",
    TransactionRule: "a transaction rule mapping with keys {keys}",
    TransactionOutput: "an output mapping with keys {keys}",
    HoldBegin: "a mapping with the key {keys}",
    Tracing: "a mapping of tracing settings",
    PrincipalRule: "a principal rule mapping with keys {keys}",
    TopicRule: "a topic rule mapping with keys {keys}",
    ColumnarRule: "a columnar mapping with keys {keys}",
    ColumnarEncryption: "an encrypt mapping with keys {keys}",
}
ReadFile = Callable[[str], str]
# The fields a segment adds that a rule may encrypt besides the value's own.
_ENCRYPTABLE = ("kafka_key", "kafka_headers")
# RuleSet fields the loader fills in; they describe the file and are not keys in it.
_NOT_IN_FILE = ("source", "version")


def default_rules() -> RuleSet:
    """The built-in rule set: what an empty rule file means."""
    return RuleSet()


def load_rules(path: str | os.PathLike[str]) -> RuleSet:
    """Read, validate and return the rule file at ``path``.

    Raises :class:`RuleError` if the file cannot be read, is not UTF-8, is not valid YAML
    or does not follow the schema; the error lists every problem found.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise _file_error(source, NO_LINE, "no such file; check the path") from None
    except IsADirectoryError:
        message = "is a directory, not a rule file; give the file's path"
        raise _file_error(source, NO_LINE, message) from None
    except OSError as e:
        message = f"cannot read the file ({e.strerror or e}); check its permissions"
        raise _file_error(source, NO_LINE, message) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        message = f"not valid UTF-8 (byte {e.start}); save the file as UTF-8"
        raise _file_error(source, line, message) from None
    # A UTF-8 round trip is lossless, so parse_rules hashes exactly the file's bytes.
    return parse_rules(text, source)


def parse_rules(text: str, source: str, *, read_file: ReadFile | None = None) -> RuleSet:
    """Validate rule-file ``text`` and return its model; ``source`` names it in messages.

    No I/O but reading the files a columnar rule names (schema and key files), through
    ``read_file(path)`` (default: the file's UTF-8 text), relative to ``source``'s folder.
    Raises :class:`RuleError` listing every problem found.
    """
    # surrogatepass: a str with lone surrogates still hashes; the YAML reader rejects it.
    data = text.encode("utf-8", "surrogatepass")
    # An empty section (every key commented out) means its defaults, as if it were absent.
    document = read_document(text, source, lambda path: is_dataclass(_base(_type_at(path))))
    check = _Check(source, document)
    sections = check.sections()
    named = check.named_files(sections, read_file or _read_text) if not check.problems else []
    if check.problems:
        # Sections are checked one after another; report top to bottom, each thing once.
        raise RuleError(sorted(dict.fromkeys(check.problems), key=lambda p: p.line))
    return RuleSet(source=source, version=_version(data, named), **sections)


def _version(data: bytes, named: list[tuple[str, str]]) -> str:
    """The rule file's version: of its bytes, and of the files it names (so a reload after
    editing a schema or key file applies it)."""
    if not named:
        return rules_version(data)
    digest = hashlib.sha256(data)
    for path, text in named:
        digest.update(b"\0" + path.encode("utf-8", "surrogatepass") + b"\0")
        digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:12]


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _file_error(source: str, line: int, message: str) -> RuleError:
    return RuleError([RuleProblem(source, line, FILE_KEY, message)])


# -- the model's types, read the way pydantic reads them ---------------------------------


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """The type under ``Annotated`` and ``| None``, with the ``Annotated`` metadata."""
    metadata: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            metadata += tp.__metadata__
            tp = get_args(tp)[0]
        elif len(_members(tp)) == 1:
            tp = _members(tp)[0]
        else:
            return tp, metadata


def _members(tp: Any) -> list[Any]:
    """The types a union may hold apart from None; [] if ``tp`` is no union."""
    if get_origin(tp) not in (Union, UnionType):
        return []
    return [member for member in get_args(tp) if member is not NoneType]


def _base(tp: Any) -> Any:
    return _unwrap(tp)[0]


@cache
def _keys(cls: type) -> dict[str, Any]:
    """The keys a mapping of ``cls`` may have, in the model's order, with their types."""
    hints = get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in fields(cls) if f.init and f.name not in _NOT_IN_FILE}


def _child(tp: Any, part: str | int) -> Any:
    base = _base(tp)
    if is_dataclass(base) and isinstance(part, str) and isinstance(base, type):
        return _keys(base).get(part)
    if _is_list(base) and isinstance(part, int):
        return get_args(base)[0]
    return None


def _type_at(path: Path) -> Any:
    tp: Any = RuleSet
    for part in path:
        tp = _child(tp, part)
    return tp


def _resolve(loc: tuple[str | int, ...]) -> tuple[Path, Any]:
    """The key path of a pydantic error location, and the type expected there."""
    path: list[str | int] = []
    tp: Any = RuleSet
    for part in loc:
        # In a union pydantic names the member it tried; that is no key of the file.
        if len(_members(_base(tp))) > 1 and isinstance(part, str):
            continue
        path.append(part)
        tp = _child(tp, part)
    return tuple(path), tp


def _in_schema(path: Path) -> bool:
    """Whether the schema has a mapping (for a key) or list (for an item) above ``path``."""
    parent = _base(_type_at(path[:-1]))
    return not path or (is_dataclass(parent) if isinstance(path[-1], str) else _is_list(parent))


def _is_list(tp: Any) -> bool:
    return get_origin(tp) is tuple


def _expected(tp: Any) -> str:
    base, metadata = _unwrap(tp)
    for item in metadata:
        if isinstance(item, FieldInfo) and item.description:
            return item.description
    if isinstance(base, type) and base in _MAPPINGS:
        return _MAPPINGS[base].format(keys=", ".join(_keys(base)))
    low = next((m.ge for m in metadata if getattr(m, "ge", None) is not None), 0)
    high = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
    if base is bool:
        return "true or false"
    if base is float:
        return f"a number >= {low:g}"
    if base is int:
        return f"an integer >= {low}" if high is None else f"an integer between {low} and {high}"
    return "a non-empty string"


def _default_text(path: Path) -> str | None:
    """What leaving the key at ``path`` out means, or None if it is required."""
    parent = _base(_type_at(path[:-1]))
    if not isinstance(parent, type) or not is_dataclass(parent) or not path:
        return None
    spec = next(f for f in fields(parent) if f.name == path[-1])
    if "absent" in spec.metadata:
        return str(spec.metadata["absent"])
    if spec.default is MISSING:
        return None
    default = spec.default
    if isinstance(default, tuple):
        return ", ".join(str(item) for item in default) or "none"
    if default is None:
        return "none"
    return f"{default:g}" if isinstance(default, float) else yaml_text(default)


def _number_hint(value: str, quoted: bool) -> str:
    # '"2"' or '1e3' (YAML 1.1 needs a dot: 1.0e3) are text to YAML but clearly meant as
    # numbers; say how to write them.
    try:
        number = float(value.replace("_", ""))
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    plain = str(int(number)) if number.is_integer() else repr(number)
    if quoted:
        return f"; remove the quotes: {plain}"
    return f"; YAML reads {value!r} as text, write the number as {plain}"


class _Check:
    """Runs pydantic over each section and words its errors as rule-file problems."""

    def __init__(self, source: str, document: Document) -> None:
        self.source = source
        self.where = document.where
        self.data = document.data
        # Inside a value the schema refuses as a whole (a list where a mapping belongs, an
        # unknown key), what is wrong with its keys is noise: that one problem is enough.
        self.problems = [problem for path, problem in document.problems if _in_schema(path)]

    def line(self, path: Path, *, at_key: bool = False) -> int:
        # A key the file does not write (a missing one) is blamed on its mapping.
        where = self.where.get(path) or self.where.get(path[:-1])
        return line_of(None if where is None else where.key if at_key else where.value)

    def problem(self, path: Path, message: str, *, at_key: bool = False) -> None:
        line = self.line(path, at_key=at_key)
        self.problems.append(RuleProblem(self.source, line, describe(path), message))

    def sections(self) -> dict[str, Any]:
        data = {} if self.data is Marker.NULL else self.data
        if not isinstance(data, dict):
            if data is not Marker.UNREADABLE:
                self.problem((), self._wrong_value((), RuleSet, data))
            return {}
        sections: dict[str, Any] = {}
        for name, value in data.items():
            if name not in _keys(RuleSet):
                self.unknown_key((name,))
                continue
            try:
                sections[name] = _adapter(name).validate_python(value)
            except ValidationError as e:
                for error in e.errors():
                    self.report((name, *error["loc"]), error)
        self.check_request_fits_frame(data, sections)
        return sections

    def report(self, loc: tuple[str | int, ...], error: ErrorDetails) -> None:
        path, tp = _resolve(loc)
        kind, value, context = error["type"], error["input"], error.get("ctx", {})
        if value is Marker.UNREADABLE:
            return  # The YAML reader has said why.
        if kind == "unexpected_keyword_argument":
            self.unknown_key(path)
        elif kind == "missing":
            self.problem(path, f"missing required key {path[-1]!r}; add it to this entry")
        elif kind == "partitions_empty":
            self.problem(
                path,
                "expected at least one partition number, got an empty list; "
                "remove the key to mean every partition of the topic",
            )
        elif kind == "partition_repeated":
            for index, first, partition in context["repeats"]:
                self.problem(
                    (*path, index),
                    f"duplicate partition {partition} (already listed as "
                    f"partitions[{first}]); list each partition once",
                )
        elif kind == "topic_repeated":
            for index, first, topic in context["repeats"]:
                self.problem(
                    (*path, index, "topic"),
                    f"topic {topic!r} is already listed at "
                    f"{describe((*path, first))} (line {self.line((*path, first))}); "
                    "list each topic once, with all its partitions",
                )
        else:
            self.problem(path, self._wrong_value(path, tp, value))

    def unknown_key(self, path: Path) -> None:
        allowed = list(_keys(_base(_type_at(path[:-1]))))
        name = str(path[-1])
        message = f"unknown key {name!r}"
        close = difflib.get_close_matches(name, allowed, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
        self.problem(path, f"{message}; allowed keys here are: {', '.join(allowed)}", at_key=True)

    def _wrong_value(self, path: Path, tp: Any, value: object) -> str:
        base = _base(tp)
        collection = "a mapping" if is_dataclass(base) else "a list" if _is_list(base) else None
        if isinstance(value, Tagged) and value.kind == collection:
            return f"unsupported YAML tag {short_tag(value.tag)}; remove the tag"
        message = f"expected {_expected(tp)}, got {got(value)}"
        if value is Marker.NULL:
            default = _default_text(path)
            if default is None:
                return message + "; fill in a value"
            return message + f"; remove the key to use the default ({default})"
        node = self.where[path].value
        if not isinstance(node, ScalarNode):
            return message
        if base in (int, float) and isinstance(value, str):
            return message + _number_hint(value, node.style in ("'", '"'))
        if base is str and node.style is None and not isinstance(value, str):
            # An unquoted 1_000, no or 2024-01-01 is not text to YAML; quoting fixes it.
            return message + f'; quote it to use it as text: "{node.value}"'
        return message

    def named_files(self, sections: dict[str, Any], read: ReadFile) -> list[tuple[str, str]]:
        """Read the files columnar rules name into them; (path, text) of each file read."""
        if columnar_missing() is not None and any(
            t.columnar is not None for t in sections.get("topics", ())
        ):
            for i, topic in enumerate(sections["topics"]):
                if topic.columnar is not None:
                    self.problem(("topics", i, "columnar"), f"{columnar_missing()}")
            return []
        folder = os.path.dirname(self.source)
        named: list[tuple[str, str]] = []
        for i, topic in enumerate(sections.get("topics", ())):
            if topic.columnar is not None:
                named += self.columnar_files(
                    ("topics", i, "columnar"), topic.columnar, folder, read
                )
        return named

    def read_named(
        self, path: Path, name: str, folder: str, read: ReadFile
    ) -> tuple[str, str] | None:
        where = os.path.join(folder, name)
        try:
            return where, read(where)
        except FileNotFoundError:
            self.problem(
                path,
                f"no such file: {where}; check the path (relative paths start from the rule "
                "file's folder)",
            )
        except UnicodeDecodeError as e:
            self.problem(path, f"{where} is not valid UTF-8 (byte {e.start}); save it as UTF-8")
        except OSError as e:
            self.problem(path, f"cannot read {where} ({e.strerror or e}); check its permissions")
        return None

    def columnar_files(
        self, path: Path, rule: ColumnarRule, folder: str, read: ReadFile
    ) -> list[tuple[str, str]]:
        named: list[tuple[str, str]] = []
        schema_file = self.read_named((*path, "schema"), rule.schema, folder, read)
        if schema_file is None:
            return named
        named.append(schema_file)
        try:
            schema = parse_value_schema(schema_file[1], schema_file[0])
            check_columnar_schema(schema)
        except ValueSchemaError as e:
            self.problem((*path, "schema"), f"{e}; fix the schema file")
            return named
        object.__setattr__(rule, "_value_schema", schema)
        if rule.encrypt is None:
            return named
        fields_there = schema.struct.names()
        for j, column in enumerate(rule.encrypt.columns):
            if column not in (*fields_there, *_ENCRYPTABLE):
                self.problem(
                    (*path, "encrypt", "columns", j),
                    f"{column!r} is not a top-level field of {schema_file[0]} (its fields: "
                    f"{', '.join(fields_there)}); name one of them, kafka_key or kafka_headers",
                )
        key_file = self.read_named(
            (*path, "encrypt", "key_file"), rule.encrypt.key_file, folder, read
        )
        if key_file is None:
            return named
        named.append(key_file)
        try:
            keys = ColumnarKeys.parse(key_file[1], key_file[0])
        except ColumnarKeyFileError as e:
            self.problem((*path, "encrypt", "key_file"), f"{e}; fix the key file")
            return named
        object.__setattr__(rule, "_keys", keys)
        return named

    def check_request_fits_frame(self, data: dict[str, Any], sections: dict[str, Any]) -> None:
        # A coalesced request bigger than the frame limit could never be sent, so the two
        # settings are only valid together; checked once both sections are.
        if any(name in data and name not in sections for name in ("limits", "coalescing")):
            return
        frame = sections.get("limits", Limits()).max_frame_bytes
        request = sections.get("coalescing", CoalescingRules()).max_request_bytes
        if request <= frame:
            return
        advice = "lower coalescing.max_request_bytes or raise limits.max_frame_bytes"
        request_path, frame_path = (
            ("coalescing", "max_request_bytes"),
            ("limits", "max_frame_bytes"),
        )
        if frame_path in self.where and request_path not in self.where:
            self.problem(
                frame_path,
                f"expected at least coalescing.max_request_bytes ({request}), got {frame}: "
                f"a coalesced request must fit in one frame; {advice}",
            )
        else:
            self.problem(
                request_path,
                f"expected at most limits.max_frame_bytes ({frame}), got {request}: "
                f"a coalesced request must fit in one frame; {advice}",
            )


@cache
def _adapter(section: str) -> TypeAdapter[Any]:
    return TypeAdapter(_keys(RuleSet)[section])
