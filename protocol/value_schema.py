"""The schema of a topic's record values: the typed columns JSON values become, from a schema file.

Two forms, chosen by the file's extension (the files `kipside lake --schema` and a columnar rule
take):
- Spark DDL (`.ddl`, `.sql`, `.txt`): `id BIGINT NOT NULL, user STRING, items ARRAY<STRUCT<sku:
  STRING, qty: INT>>`. :func:`parse_ddl_schema` reads the part of Spark's DDL that JSON values
  can fill (the types of :data:`ATOMIC_TYPES`, DECIMAL(p, s), ARRAY, STRUCT and MAP, NOT NULL,
  COMMENT) without Spark; `kipside lake` still has Spark's own parser read a DDL file, and a test
  keeps the two in agreement.
- A JSON Schema subset (`.json`, `.yaml`, `.yml`): an object with `properties` and `required`;
  types string (with `format` date-time or date), integer, number, boolean, array (`items`),
  object (`properties`), and a type list of one of those plus "null"; `required` only at the
  top level. Keywords that only document ($schema, $id, title, description, examples, default,
  additionalProperties) are ignored; anything that would change what a value may be and isn't
  supported (oneOf, $ref, enum, ...) is an error rather than silently ignored. Read as YAML nodes
  (JSON is YAML, once its tabs are spaces), so every error names its line.

Either way the result is a :class:`ValueSchema` of plain frozen types named as Spark names them
(`bigint`, `array<string>`), which the lake maps to Spark's types and :meth:`ValueSchema.to_arrow`
to Arrow's (pyarrow is imported there, on first use, so the sidecar loads it only when a rule
needs it). A problem is a :class:`ValueSchemaError` "FILE:LINE: what is wrong; what to write
instead".

Pure: text in, model out. It never reads a file (the caller does) and never imports trio,
sockets or another kipside package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ATOMIC_TYPES",
    "DDL_SUFFIXES",
    "JSON_SUFFIXES",
    "ArrayOf",
    "Atomic",
    "DecimalOf",
    "MapOf",
    "SchemaField",
    "StructOf",
    "ValueSchema",
    "ValueSchemaError",
    "ValueType",
    "arrow_type",
    "check_reserved_names",
    "ddl_field_lines",
    "ddl_is_empty",
    "parse_ddl_schema",
    "parse_json_schema",
    "parse_value_schema",
    "walk_types",
]

DDL_SUFFIXES: Final = (".ddl", ".sql", ".txt")
JSON_SUFFIXES: Final = (".json", ".yaml", ".yml")

# Spark's simpleString of each atomic type, and the DDL words that name it.
ATOMIC_TYPES: Final[dict[str, tuple[str, ...]]] = {
    "boolean": ("BOOLEAN",),
    "tinyint": ("TINYINT", "BYTE"),
    "smallint": ("SMALLINT", "SHORT"),
    "int": ("INT", "INTEGER"),
    "bigint": ("BIGINT", "LONG"),
    "float": ("FLOAT", "REAL"),
    "double": ("DOUBLE",),
    "string": ("STRING",),
    "binary": ("BINARY",),
    "date": ("DATE",),
    "timestamp": ("TIMESTAMP", "TIMESTAMP_LTZ"),
    "timestamp_ntz": ("TIMESTAMP_NTZ",),
}
_DDL_ATOMIC: Final = {word: name for name, words in ATOMIC_TYPES.items() for word in words}
_DECIMAL_WORDS: Final = ("DECIMAL", "DEC", "NUMERIC")
_DECIMAL_MAX_PRECISION: Final = 38  # Spark's and Arrow's decimal128


class ValueSchemaError(ValueError):
    """The schema can't be used; the message starts with FILE:LINE. `line` is that line."""

    def __init__(self, message: str, *, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class Atomic:
    """A type with no parts, by Spark's name for it: one of :data:`ATOMIC_TYPES`."""

    name: str

    def simple_string(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class DecimalOf:
    precision: int = 10
    scale: int = 0

    def simple_string(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True, slots=True)
class ArrayOf:
    element: ValueType
    contains_null: bool = True

    def simple_string(self) -> str:
        return f"array<{self.element.simple_string()}>"


@dataclass(frozen=True, slots=True)
class MapOf:
    key: ValueType
    value: ValueType
    value_contains_null: bool = True

    def simple_string(self) -> str:
        return f"map<{self.key.simple_string()},{self.value.simple_string()}>"


@dataclass(frozen=True, slots=True)
class SchemaField:
    name: str
    type: ValueType
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class StructOf:
    fields: tuple[SchemaField, ...]

    def simple_string(self) -> str:
        inner = ",".join(f"{f.name}:{f.type.simple_string()}" for f in self.fields)
        return f"struct<{inner}>"

    def names(self) -> list[str]:
        return [f.name for f in self.fields]


ValueType = Atomic | DecimalOf | ArrayOf | MapOf | StructOf


@dataclass(frozen=True, slots=True)
class ValueSchema:
    """A schema file's fields. Top-level fields are all nullable in `struct`; `required` names
    those a value must have (not missing, not null)."""

    struct: StructOf
    required: tuple[str, ...]
    source: str
    lines: tuple[tuple[str, int], ...] = ()
    """(name, line) of each top-level field, for errors about a name."""

    def line_of(self, name: str) -> int:
        return dict(self.lines).get(name, 1)

    def check_reserved(self, reserved: Iterable[str], who: str) -> None:
        """Refuse a top-level field named (in any case: Spark's names ignore it) like one of
        `reserved`, the columns `who` adds itself."""
        check_reserved_names(self.source, self.struct.names(), dict(self.lines), reserved, who)

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema of these fields, as PySpark converts the same Spark types (required
        top-level fields not nullable). Imports pyarrow."""
        import pyarrow as pa

        required = set(self.required)
        fields = self.struct.fields
        return pa.schema(
            [pa.field(f.name, arrow_type(f.type), f.name not in required) for f in fields]
        )


def arrow_type(kind: ValueType) -> pa.DataType:
    """The Arrow type PySpark gives the Spark type of the same name (imports pyarrow)."""
    import pyarrow as pa

    if isinstance(kind, Atomic):
        return {
            "boolean": pa.bool_(),
            "tinyint": pa.int8(),
            "smallint": pa.int16(),
            "int": pa.int32(),
            "bigint": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "string": pa.string(),
            "binary": pa.binary(),
            "date": pa.date32(),
            "timestamp": pa.timestamp("us", tz="UTC"),
            "timestamp_ntz": pa.timestamp("us"),
        }[kind.name]
    if isinstance(kind, DecimalOf):
        return pa.decimal128(kind.precision, kind.scale)
    if isinstance(kind, ArrayOf):
        return pa.list_(pa.field("element", arrow_type(kind.element), kind.contains_null))
    if isinstance(kind, MapOf):
        value = pa.field("value", arrow_type(kind.value), kind.value_contains_null)
        return pa.map_(pa.field("key", arrow_type(kind.key), False), value)
    return pa.struct([pa.field(f.name, arrow_type(f.type), f.nullable) for f in kind.fields])


def check_reserved_names(
    source: str, names: Iterable[str], lines: dict[str, int], reserved: Iterable[str], who: str
) -> None:
    taken = tuple(reserved)
    lowered = {r.lower() for r in taken}
    for name in names:
        if name.lower() in lowered:
            raise ValueSchemaError(
                f"{source}:{lines.get(name, 1)}: field {name!r} clashes with a column {who} adds "
                f"({', '.join(taken)}; Spark ignores case); rename it in the schema",
                line=lines.get(name, 1),
            )


def parse_value_schema(text: str, source: str) -> ValueSchema:
    """A schema file's text, read by the form its name's extension says (`source` is the file's
    name, for that and for messages)."""
    suffix = _suffix(source)
    if suffix in JSON_SUFFIXES:
        return parse_json_schema(text, source)
    if suffix in DDL_SUFFIXES:
        return parse_ddl_schema(text, source)
    raise ValueSchemaError(
        f"{source}: unknown schema file type {suffix or '(none)'!r}: name it .ddl (Spark DDL) "
        "or .json/.yaml (JSON Schema)",
        line=0,
    )


def _suffix(source: str) -> str:
    name = source.replace("\\", "/").rsplit("/", 1)[-1]
    return "." + name.rsplit(".", 1)[1].lower() if "." in name.lstrip(".") else ""


# ---- Spark DDL ------------------------------------------------------------------------------

# Spark SQL's lexer, as far as DDL needs: comments and string literals (where `--` and commas
# mean nothing), quoted names, brackets.
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


def ddl_field_lines(text: str) -> dict[str, int]:
    """The line of each top-level field name of a DDL schema: the first name after the start or
    a comma that no <>, () or string holds."""
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


def ddl_is_empty(text: str) -> bool:
    """Whether a DDL text holds nothing but space and comments."""
    return all(token.lastgroup == "skip" for token in _DDL_TOKEN.finditer(text))


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    line: int


class _DdlReader:
    """A recursive-descent reader of Spark's table schema DDL (`colName dataType [NOT NULL]
    [COMMENT 'text'], ...`), for the types JSON values can fill."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.tokens: list[_Token] = []
        for token in _DDL_TOKEN.finditer(text):
            kind = token.lastgroup or "other"
            if kind != "skip":
                line = text.count("\n", 0, token.start()) + 1
                self.tokens.append(_Token(kind, token.group(), line))
        self.pos = 0

    def fail(self, message: str, token: _Token | None = None) -> ValueSchemaError:
        at = token or self.peek()
        line = at.line if at else (self.tokens[-1].line if self.tokens else 1)
        return ValueSchemaError(f"{self.source}:{line}: {message}", line=line)

    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def next(self, what: str) -> _Token:
        token = self.peek()
        if token is None:
            raise self.fail(f"the schema ends where {what} belongs")
        self.pos += 1
        return token

    def peek_text(self) -> str | None:
        token = self.peek()
        return None if token is None else token.text

    def word_is(self, *words: str) -> bool:
        token = self.peek()
        return token is not None and token.kind == "word" and token.text.upper() in words

    def expect(self, text: str, what: str) -> _Token:
        token = self.next(what)
        if token.text != text:
            raise self.fail(f"expected {text!r} {what}, found {token.text!r}", token)
        return token

    def name(self, what: str) -> tuple[str, _Token]:
        token = self.next(what)
        if token.kind == "word":
            return token.text, token
        if token.kind == "quoted":
            return token.text[1:-1].replace("``", "`"), token
        raise self.fail(f"expected {what}, found {token.text!r}", token)

    def fields(self, closing: str | None) -> tuple[list[SchemaField], dict[str, int]]:
        fields: list[SchemaField] = []
        lines: dict[str, int] = {}
        while True:
            name, token = self.name("a field name")
            if closing is not None and self.peek_text() == ":":
                self.pos += 1
            kind = self.type()
            nullable = True
            if self.word_is("NOT"):
                self.pos += 1
                if not self.word_is("NULL"):
                    raise self.fail("NOT must be followed by NULL")
                self.pos += 1
                nullable = False
            if self.word_is("COMMENT"):
                self.pos += 1
                comment = self.next("the comment text")
                if comment.kind != "string":
                    raise self.fail("COMMENT takes a quoted text: COMMENT 'what it is'", comment)
            if name.lower() in (n.lower() for n in lines):
                raise self.fail(f"field {name!r} is given twice", token)
            lines[name] = token.line
            fields.append(SchemaField(name, kind, nullable))
            token_after = self.peek()
            if token_after is None or (closing is not None and token_after.text == closing):
                return fields, lines
            if token_after.text != ",":
                raise self.fail(
                    f"expected ',' between fields, found {token_after.text!r}", token_after
                )
            self.pos += 1

    def type(self) -> ValueType:
        token = self.next("a type")
        word = token.text.upper() if token.kind == "word" else ""
        if word in _DDL_ATOMIC:
            return Atomic(_DDL_ATOMIC[word])
        if word in _DECIMAL_WORDS:
            return self.decimal(token)
        if word == "ARRAY":
            self.expect("<", "after ARRAY")
            element = self.type()
            self.expect(">", "closing ARRAY<...>")
            return ArrayOf(element, True)
        if word == "MAP":
            self.expect("<", "after MAP")
            key = self.type()
            self.expect(",", "between a MAP's key and value types")
            value = self.type()
            self.expect(">", "closing MAP<...>")
            return MapOf(key, value, True)
        if word == "STRUCT":
            self.expect("<", "after STRUCT")
            if self.peek_text() == ">":
                raise self.fail("a STRUCT needs at least one field")
            fields, _ = self.fields(">")
            self.expect(">", "closing STRUCT<...>")
            return StructOf(tuple(fields))
        if token.kind != "word":
            raise self.fail(
                f"expected a type, found {token.text!r} (a schema is a list of fields: "
                "`name TYPE, name TYPE`)",
                token,
            )
        raise self.fail(
            f"type {token.text!r} is not supported here (use BOOLEAN, TINYINT, SMALLINT, INT, "
            "BIGINT, FLOAT, DOUBLE, DECIMAL(p, s), STRING, BINARY, DATE, TIMESTAMP, "
            "TIMESTAMP_NTZ, ARRAY<...>, STRUCT<...> or MAP<...>)",
            token,
        )

    def decimal(self, token: _Token) -> DecimalOf:
        if self.peek_text() != "(":
            return DecimalOf(10, 0)
        self.pos += 1
        numbers = [self.integer("a DECIMAL's precision")]
        if self.peek_text() == ",":
            self.pos += 1
            numbers.append(self.integer("a DECIMAL's scale"))
        self.expect(")", "closing DECIMAL(...)")
        precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
        if not 1 <= precision <= _DECIMAL_MAX_PRECISION or scale > precision:
            raise self.fail(
                f"DECIMAL({precision}, {scale}): the precision must be 1 to "
                f"{_DECIMAL_MAX_PRECISION} and the scale at most the precision",
                token,
            )
        return DecimalOf(precision, scale)

    def integer(self, what: str) -> int:
        token = self.next(what)
        if token.kind != "word" or not token.text.isdigit():
            raise self.fail(f"expected {what} (a whole number), found {token.text!r}", token)
        return int(token.text)


def parse_ddl_schema(text: str, source: str) -> ValueSchema:
    """A Spark DDL table schema, as Spark's StructType.fromDDL reads it, for the types JSON values
    can fill. NOT NULL makes a top-level field required; top-level fields become nullable."""
    if ddl_is_empty(text):
        raise ValueSchemaError(
            f"{source}:1: the schema is empty; list fields like `id BIGINT, name STRING`", line=1
        )
    reader = _DdlReader(source, text)
    fields, lines = reader.fields(None)
    if (rest := reader.peek_text()) is not None:
        raise reader.fail(f"unexpected {rest!r} after the last field")
    required = tuple(f.name for f in fields if not f.nullable)
    struct = StructOf(tuple(SchemaField(f.name, f.type, True) for f in fields))
    return ValueSchema(struct, required, source, tuple(lines.items()))


# ---- JSON Schema ----------------------------------------------------------------------------

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
_SCALARS: Final[dict[str, ValueType]] = {
    "string": Atomic("string"),
    "integer": Atomic("bigint"),
    "number": Atomic("double"),
    "boolean": Atomic("boolean"),
}
_FORMATS: Final[dict[str, ValueType]] = {"date-time": Atomic("timestamp"), "date": Atomic("date")}
_KEYWORDS: Final = {"type", "format", "items", "properties", "required"}


def _json_error(text: str) -> json.JSONDecodeError | None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc
    return None


def _compose(source: str, text: str) -> Node:
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
        if tab_error is not None and source.lower().endswith(".json"):
            # YAML would blame the first tab, which JSON allows; JSON knows the real problem.
            raise ValueSchemaError(
                f"{source}:{tab_error.lineno}: not valid JSON: {tab_error.msg}",
                line=tab_error.lineno,
            ) from None
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueSchemaError(
            f"{source}:{line}: not valid JSON or YAML: {problem}", line=line
        ) from None
    if root is None:
        raise ValueSchemaError(f"{source}:1: the schema is empty", line=1)
    return root


def parse_json_schema(text: str, source: str) -> ValueSchema:
    """A JSON Schema subset document (JSON or YAML text)."""
    root = _compose(source, text)
    walker = _Walker(source)
    struct = walker.object(root, "the schema", top=True)
    required = walker.required(root)
    return ValueSchema(struct, required, source, tuple(walker.field_lines(root).items()))


class _Walker:
    """Turns YAML nodes of a JSON Schema into value types."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: Node, text: str) -> ValueSchemaError:
        line = node.start_mark.line + 1
        return ValueSchemaError(f"{self.source}:{line}: {text}", line=line)

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

    def object(self, node: Node, what: str, top: bool = False) -> StructOf:
        keys = self.mapping(node, what)
        if "required" in keys and not top:
            raise self.fail(
                keys["required"][0],
                f"{what}: required is only supported at the top level of the schema (kipside "
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
            fields.append(SchemaField(name, self.type_of(value, f"property {name!r}"), True))
        if not fields:
            raise self.fail(keys["properties"][1], f"{what} lists no properties")
        return StructOf(tuple(fields))

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
                    f"{what}: keyword {name!r} is not supported by kipside's JSON Schema "
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

    def type_of(self, node: Node, what: str) -> ValueType:
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
            return ArrayOf(self.type_of(keys["items"][1], f"{what}'s items"), True)
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


def walk_types(kind: ValueType) -> Iterator[ValueType]:
    """`kind` and every type inside it, outside in."""
    yield kind
    if isinstance(kind, ArrayOf):
        yield from walk_types(kind.element)
    elif isinstance(kind, MapOf):
        yield from walk_types(kind.key)
        yield from walk_types(kind.value)
    elif isinstance(kind, StructOf):
        for f in kind.fields:
            yield from walk_types(f.type)
