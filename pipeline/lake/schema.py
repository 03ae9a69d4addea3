"""The lake's schema file: the typed columns JSON record values become.

Two forms, chosen by the file's extension:
- Spark DDL (`.ddl`, `.sql`, `.txt`): `id BIGINT NOT NULL, user STRING, items ARRAY<STRUCT<sku:
  STRING, qty: INT>>`, as `StructType.fromDDL` reads it; NOT NULL makes a top-level field
  required. Parsed by Spark itself, so it needs the session, and its syntax errors keep their
  line.
- A JSON Schema subset (`.json`, `.yaml`, `.yml`): an object with `properties` and `required`;
  types string (with `format` date-time or date), integer, number, boolean, array (`items`),
  object (`properties`), and a type list of one of those plus "null". Keywords that only
  document ($schema, $id, title, description, examples, default, additionalProperties) are
  ignored; anything that would change what a value may be and isn't supported (oneOf, $ref,
  enum, ...) is an error rather than silently ignored. Read as YAML nodes (JSON is YAML), so
  every error names its line.

Either way a problem is a SchemaError "FILE:LINE: what is wrong; what to write instead".
Columns the lake adds itself (topic, date, kafka_partition, kafka_offset, kafka_timestamp) may
not be fields of the schema.
"""

from __future__ import annotations

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
_PARSE_POSITION: Final = re.compile(r"\(line (\d+), pos (\d+)\)")


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


def _check_reserved(path: str, names: list[str], line_of: Callable[[str], int]) -> None:
    for name in names:
        if name in RESERVED:
            raise SchemaError(
                f"{path}:{line_of(name)}: field {name!r} clashes with a column the lake adds "
                f"({', '.join(RESERVED)}); rename it in the schema"
            )


def _from_ddl(path: str, text: str, parse_ddl: Callable[[str], DataType]) -> LakeSchema:
    body = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    if not body.strip():
        raise SchemaError(
            f"{path}:1: the schema is empty; list fields like `id BIGINT, name STRING`"
        )
    try:
        parsed = parse_ddl(body)
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

    def line_of(name: str) -> int:
        for number, line in enumerate(text.splitlines(), start=1):
            if re.search(rf"(^|[\s,`]){re.escape(name)}([\s`:]|$)", line):
                return number
        return 1

    _check_reserved(path, parsed.fieldNames(), line_of)
    required = tuple(f.name for f in parsed.fields if not f.nullable)
    nullable = StructType([StructField(f.name, f.dataType, True) for f in parsed.fields])
    return LakeSchema(nullable, required, path)


def _from_json_schema(path: str, text: str) -> LakeSchema:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise SchemaError(f"{path}:{line}: not valid JSON or YAML: {problem}") from None
    if root is None:
        raise SchemaError(f"{path}:1: the schema is empty")
    walker = _Walker(path)
    struct = walker.object(root, "the schema")
    required = walker.required(root)
    names = [f.name for f in struct.fields]
    _check_reserved(path, names, lambda name: walker.lines.get(name, 1))
    return LakeSchema(struct, required, path)


class _Walker:
    """Turns YAML nodes of a JSON Schema into Spark types, remembering field lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: dict[str, int] = {}

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

    def object(self, node: Node, what: str) -> StructType:
        keys = self.mapping(node, what)
        self.check_keywords(keys, what, {"type", "properties", "required"})
        kind = self.type_name(keys, node, what)
        if kind != "object":
            raise self.fail(node, f"{what} must have type object, not {kind!r}")
        if "properties" not in keys:
            raise self.fail(node, f"{what} lists no properties")
        fields = []
        for name, (key_node, value) in self.mapping(
            keys["properties"][1], f"{what}'s properties"
        ).items():
            self.lines.setdefault(name, key_node.start_mark.line + 1)
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
        known = set(self.mapping(keys["properties"][1], "properties"))
        for n, name in zip(seq.value, names, strict=True):
            if name not in known:
                raise self.fail(n, f"required names {name!r}, which is not a property")
        return names

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
