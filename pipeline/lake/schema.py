"""The lake's schema file: the typed columns JSON record values become.

Two forms, chosen by the file's extension:
- Spark DDL (`.ddl`, `.sql`, `.txt`): `id BIGINT NOT NULL, user STRING, items ARRAY<STRUCT<sku:
  STRING, qty: INT>>`, as `StructType.fromDDL` reads it; NOT NULL makes a top-level field
  required. Parsed by Spark itself, so it needs the session, and its syntax errors keep their
  line.
- A JSON Schema subset (`.json`, `.yaml`, `.yml`): an object with `properties` and `required`;
  types string (with `format` date-time or date), integer, number, boolean, array (`items`),
  object (`properties`), and a type list of one of those plus "null"; `required` only at the
  top level, the one place the lake checks it. Keywords that only document ($schema, $id,
  title, description, examples, default, additionalProperties) are ignored; anything that
  would change what a value may be and isn't supported (oneOf, $ref, enum, ...) is an error
  rather than silently ignored. Read as YAML nodes (JSON is YAML, once its tabs are spaces), so
  every error names its line.

Either way a problem is a SchemaError "FILE:LINE: what is wrong; what to write instead".
Columns the lake adds itself (topic, date, kafka_partition, kafka_offset, kafka_timestamp) may
not be top-level fields of the schema, whatever their case (Spark's column names ignore case).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["RESERVED", "LakeSchema", "SchemaError", "load_schema"]

RESERVED: Final = ("topic", "date", "kafka_partition", "kafka_offset", "kafka_timestamp")
DDL_SUFFIXES: Final = (".ddl", ".sql", ".txt")
JSON_SUFFIXES: Final = (".json", ".yaml", ".yml")
_DOC_KEYWORDS: Final = {
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "examples",
    "default",
    "additionalProperties",
    "readOnly",
    "writeOnly",
    "deprecated",
}
_SCALARS: Final[dict[str, DataType]] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}
_FORMATS: Final[dict[str, DataType]] = {"date-time": TimestampType(), "date": DateType()}
_KEYWORDS: Final = {"type", "format", "items", "properties", "required"}
_PARSE_POSITION: Final = re.compile(r"\(line (\d+), pos (\d+)\)")
# Spark SQL's lexer, as far as finding top-level field names needs: comments and string
# literals (where `--` and commas mean nothing), quoted names, brackets.
_DDL_TOKEN: Final = re.compile(
    r"""(?P<skip>\s+|--[^\n]*|/\*.*?\*/)
    |(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<quoted>`(?:[^`]|``)*`)
    |(?P<word>\w+)
    |(?P<open>[<(\[])
    |(?P<close>[>)\]])
    |(?P<comma>,)
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


class SchemaError(ValueError):
    """The schema file can't be used; the message starts with FILE:LINE."""


@dataclass(frozen=True)
class LakeSchema:
    struct: StructType
    required: tuple[str, ...]
    """Top-level fields a value must have (not missing, not null)."""
    source: str


def load_schema(path: str, parse_ddl: Callable[[str], DataType] | None = None) -> LakeSchema:
    """Read a schema file. DDL needs `parse_ddl` (Spark's parser: StructType.fromDDL)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read the schema file: {exc.strerror or exc}") from None
    suffix = file.suffix.lower()
    if suffix in JSON_SUFFIXES:
        schema = _from_json_schema(path, text)
    elif suffix in DDL_SUFFIXES:
        if parse_ddl is None:
            raise SchemaError(f"{path}: a DDL schema is read by Spark; start a session first")
        schema = _from_ddl(path, text, parse_ddl)
    else:
        raise SchemaError(
            f"{path}: unknown schema file type {suffix or '(none)'!r}: name it .ddl (Spark DDL) "
            "or .json/.yaml (JSON Schema)"
        )
    return schema


def _check_reserved(path: str, names: list[str], lines: dict[str, int]) -> None:
    for name in names:
        if name.lower() in RESERVED:
            raise SchemaError(
                f"{path}:{lines.get(name, 1)}: field {name!r} clashes with a column the lake "
                f"adds ({', '.join(RESERVED)}; Spark ignores case); rename it in the schema"
            )


def _ddl_field_lines(text: str) -> dict[str, int]:
    """The line of each top-level field name: the first name after the start or a comma that
    no <>, () or string holds."""
    lines: dict[str, int] = {}
    depth, at_name = 0, True
    for token in _DDL_TOKEN.finditer(text):
        kind = token.lastgroup
        if kind == "skip":
            continue
        if at_name and depth == 0 and kind in ("word", "quoted"):
            name = token.group()
            name = name[1:-1].replace("``", "`") if kind == "quoted" else name
            lines.setdefault(name, text.count("\n", 0, token.start()) + 1)
        at_name = kind == "comma" and depth == 0
        depth += {"open": 1, "close": -1}.get(kind or "", 0)
    return lines


def _from_ddl(path: str, text: str, parse_ddl: Callable[[str], DataType]) -> LakeSchema:
    if all(token.lastgroup == "skip" for token in _DDL_TOKEN.finditer(text)):
        raise SchemaError(
            f"{path}:1: the schema is empty; list fields like `id BIGINT, name STRING`"
        )
    try:
        parsed = parse_ddl(text)  # Spark's parser skips the comments itself
    except Exception as exc:  # Spark's ParseException, with (line N, pos M) in its text
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        found = _PARSE_POSITION.search(str(exc))
        line = found.group(1) if found else "1"
        message = _PARSE_POSITION.sub("", re.sub(r"\s*SQLSTATE: \w+", "", message)).strip()
        raise SchemaError(f"{path}:{line}: {message}") from None
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise SchemaError(
            f"{path}:1: the schema must be a list of fields, got {parsed.simpleString()}"
        )
    _check_reserved(path, parsed.fieldNames(), _ddl_field_lines(text))
    required = tuple(f.name for f in parsed.fields if not f.nullable)
    nullable = StructType([StructField(f.name, f.dataType, True) for f in parsed.fields])
    return LakeSchema(nullable, required, path)


def _json_error(text: str) -> json.JSONDecodeError | None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc
    return None


def _compose(path: str, text: str) -> Node:
    tab_error = None
    if "\t" in text:
        tab_error = _json_error(text)
        if tab_error is None:
            # YAML forbids tab indentation, JSON doesn't. In valid JSON a raw tab can only be
            # space between tokens (a string must escape it): a space means the same, same line.
            text = text.replace("\t", " ")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        if tab_error is not None and path.lower().endswith(".json"):
            # YAML would blame the first tab, which JSON allows; JSON knows the real problem.
            raise SchemaError(
                f"{path}:{tab_error.lineno}: not valid JSON: {tab_error.msg}"
            ) from None
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise SchemaError(f"{path}:{line}: not valid JSON or YAML: {problem}") from None
    if root is None:
        raise SchemaError(f"{path}:1: the schema is empty")
    return root


def _from_json_schema(path: str, text: str) -> LakeSchema:
    root = _compose(path, text)
    walker = _Walker(path)
    struct = walker.object(root, "the schema", top=True)
    required = walker.required(root)
    _check_reserved(path, struct.fieldNames(), walker.field_lines(root))
    return LakeSchema(struct, required, path)


class _Walker:
    """Turns YAML nodes of a JSON Schema into Spark types."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: Node, text: str) -> SchemaError:
        return SchemaError(f"{self.path}:{node.start_mark.line + 1}: {text}")

    def mapping(self, node: Node, what: str) -> dict[str, tuple[Node, Node]]:
        if not isinstance(node, MappingNode):
            raise self.fail(node, f"{what} must be an object")
        out: dict[str, tuple[Node, Node]] = {}
        for key, value in node.value:
            if not isinstance(key, ScalarNode):
                raise self.fail(key, f"{what} has a key that is not a string")
            if key.value in out:
                raise self.fail(key, f"{what} has {key.value!r} twice")
            out[key.value] = (key, value)
        return out

    def object(self, node: Node, what: str, top: bool = False) -> StructType:
        keys = self.mapping(node, what)
        if "required" in keys and not top:
            raise self.fail(
                keys["required"][0],
                f"{what}: required is only supported at the top level of the schema (the lake "
                "checks top-level fields only); remove it here",
            )
        self.check_keywords(keys, what, {"type", "properties", "required"})
        kind = self.type_name(keys, node, what)
        if kind != "object":
            raise self.fail(node, f"{what} must have type object, not {kind!r}")
        if "properties" not in keys:
            raise self.fail(node, f"{what} lists no properties")
        fields = []
        for name, (_key, value) in self.mapping(
            keys["properties"][1], f"{what}'s properties"
        ).items():
            fields.append(StructField(name, self.type_of(value, f"property {name!r}"), True))
        if not fields:
            raise self.fail(keys["properties"][1], f"{what} lists no properties")
        return StructType(fields)

    def required(self, node: Node) -> tuple[str, ...]:
        keys = self.mapping(node, "the schema")
        if "required" not in keys:
            return ()
        seq = keys["required"][1]
        if not isinstance(seq, SequenceNode) or not all(
            isinstance(n, ScalarNode) for n in seq.value
        ):
            raise self.fail(seq, "required must be a list of property names")
        names = tuple(str(n.value) for n in seq.value)
        known = self.field_lines(node)
        for n, name in zip(seq.value, names, strict=True):
            if name not in known:
                raise self.fail(n, f"required names {name!r}, which is not a property")
        return names

    def field_lines(self, node: Node) -> dict[str, int]:
        """The line of each property name of an object `object()` has accepted."""
        properties = self.mapping(node, "the schema")["properties"][1]
        return {
            name: key.start_mark.line + 1
            for name, (key, _value) in self.mapping(properties, "properties").items()
        }

    def check_keywords(
        self, keys: dict[str, tuple[Node, Node]], what: str, allowed: set[str]
    ) -> None:
        for name, (key_node, _value) in keys.items():
            if name not in allowed and name not in _DOC_KEYWORDS:
                raise self.fail(
                    key_node,
                    f"{what}: keyword {name!r} is not supported by kipside lake's JSON Schema "
                    "subset (see docs/lake.md); remove it or describe the field with type, "
                    "format, items, properties and required",
                )

    def type_name(self, keys: dict[str, tuple[Node, Node]], node: Node, what: str) -> str:
        if "type" not in keys:
            raise self.fail(node, f"{what} has no type")
        type_node = keys["type"][1]
        if isinstance(type_node, ScalarNode):
            return str(type_node.value)
        if isinstance(type_node, SequenceNode):
            names = [str(n.value) for n in type_node.value if isinstance(n, ScalarNode)]
            kinds = [n for n in names if n != "null"]
            if len(kinds) == 1 and len(names) == len(type_node.value):
                return kinds[0]
        raise self.fail(type_node, f'{what}: type must be one type name, or one and "null"')

    def type_of(self, node: Node, what: str) -> DataType:
        keys = self.mapping(node, what)
        # An unsupported keyword ($ref, oneOf) often stands in for the type: name it first.
        self.check_keywords(keys, what, _KEYWORDS)
        kind = self.type_name(keys, node, what)
        if kind == "object":
            return self.object(node, what)
        if kind == "array":
            self.check_keywords(keys, what, {"type", "items"})
            if "items" not in keys:
                raise self.fail(node, f"{what}: an array needs items")
            return ArrayType(self.type_of(keys["items"][1], f"{what}'s items"), True)
        if kind not in _SCALARS:
            raise self.fail(
                keys["type"][1],
                f"{what}: type {kind!r} is not supported (use string, integer, number, "
                "boolean, array or object)",
            )
        self.check_keywords(keys, what, {"type", "format"})
        if "format" in keys:
            fmt = str(keys["format"][1].value)
            if kind != "string" or fmt not in _FORMATS:
                raise self.fail(
                    keys["format"][1],
                    f"{what}: format {fmt!r} is not supported (strings take date-time or date)",
                )
            return _FORMATS[fmt]
        return _SCALARS[kind]
