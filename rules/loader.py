"""Reading and validating kipside rule files (YAML) into the :mod:`rules.model`.

The file is composed into a YAML node tree with PyYAML's ``SafeLoader`` and validated
against that tree rather than against ``yaml.safe_load``'s plain dicts, because only the
nodes remember where they came from: every problem names the file, the 1-based line and
the dotted key path (``transactions[0].outputs[1].partitions``), says what was expected
and what to do. All problems in a file are collected and raised together as one
:class:`~rules.errors.RuleError`; a model is only built from a file with no problems.

Scalars are turned into Python values by ``SafeLoader``'s own constructor, so a value
means exactly what ``yaml.safe_load`` would make of it (``yes`` is a boolean, ``1_000`` is
an integer, ``!!python/object`` is refused). On top of ``safe_load`` this module rejects
duplicate keys (``safe_load`` silently keeps the last one) and unknown keys.

This module must never use an unsafe YAML loader (``yaml.load`` with ``Loader``,
``FullLoader`` or ``UnsafeLoader``), never do I/O other than reading the one rule file in
:func:`load_rules`, and never import trio, ``proxy`` or ``protocol``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kipside.rules.errors import FILE_KEY, SYNTAX_KEY, TOP_LEVEL_KEY, RuleError, RuleProblem
from kipside.rules.model import (
    API_KEY_MAX,
    API_KEY_MIN,
    COALESCING_ENABLED_DEFAULT,
    DEFAULT_TRACED_API_KEYS,
    HOLD_BEGIN_MAX_MS_DEFAULT,
    HOLD_BEGIN_MAX_MS_MAX,
    HOLD_BEGIN_MAX_MS_MIN,
    LANES_DEFAULT,
    LANES_MAX,
    LANES_MIN,
    LINGER_MS_DEFAULT,
    MAX_CONNECTIONS_DEFAULT,
    MAX_CONNECTIONS_MIN,
    MAX_FRAME_BYTES_DEFAULT,
    MAX_FRAME_BYTES_MAX,
    MAX_FRAME_BYTES_MIN,
    MAX_REQUEST_BYTES_DEFAULT,
    MAX_REQUEST_BYTES_MIN,
    PARTITION_MAX,
    TRACING_ENABLED_DEFAULT,
    CoalescingRule,
    CoalescingRules,
    HoldBegin,
    Limits,
    RuleSet,
    Tracing,
    TransactionOutput,
    TransactionRule,
    rules_version,
)

__all__ = ["default_rules", "load_rules", "parse_rules"]

T = TypeVar("T")

_YAML_TAG = "tag:yaml.org,2002:"
_MAP_TAG = _YAML_TAG + "map"
_SEQ_TAG = _YAML_TAG + "seq"
_STR_TAG = _YAML_TAG + "str"
_NULL_TAG = _YAML_TAG + "null"
_MERGE_TAG = _YAML_TAG + "merge"

# Aliases let a short file expand into a huge tree (the "billion laughs" pattern: a list of
# aliases to a list of aliases ...). Validation walks the expanded tree, so it is capped.
# A real rule file is a few hundred values; this leaves room for thousands of partitions.
_NODE_BUDGET = 1_000_000

# Kafka's own rule for topic names (kafka.common.internals.Topic): a name outside it can
# never exist on a broker, so a rule naming it is certainly a typo.
_TOPIC_NAME_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_TOPIC_EXPECTED = "a Kafka topic name (1 to 249 of the characters a-z A-Z 0-9 . _ -)"

# Keys in the order they are documented; the messages for unknown keys list them this way.
_TOP_KEYS = ("limits", "coalescing", "transactions", "tracing")
_LIMITS_KEYS = ("max_frame_bytes", "max_connections")
_COALESCING_KEYS = ("enabled", "lanes", "linger_ms", "max_request_bytes", "rules")
_COALESCING_RULE_KEYS = ("topic", "client_id", "coalesce")
_TRANSACTION_KEYS = ("transactional_id", "outputs", "consumer_group", "hold_begin")
_OUTPUT_KEYS = ("topic", "partitions")
_HOLD_BEGIN_KEYS = ("max_ms",)
_TRACING_KEYS = ("enabled", "api_keys")

# Default of every optional scalar key, by key path with list indexes written as "[]". A
# key given as an empty value (null) is told it can simply be removed to get this.
_DEFAULT_TEXT = {
    "limits.max_frame_bytes": str(MAX_FRAME_BYTES_DEFAULT),
    "limits.max_connections": str(MAX_CONNECTIONS_DEFAULT),
    "coalescing.enabled": "true" if COALESCING_ENABLED_DEFAULT else "false",
    "coalescing.lanes": str(LANES_DEFAULT),
    "coalescing.linger_ms": f"{LINGER_MS_DEFAULT:g}",
    "coalescing.max_request_bytes": str(MAX_REQUEST_BYTES_DEFAULT),
    "coalescing.rules": "no rules",
    "coalescing.rules[].topic": "'*'",
    "coalescing.rules[].client_id": "'*'",
    "transactions": "no rules",
    "transactions[].outputs[].partitions": "every partition",
    "transactions[].consumer_group": "none",
    "transactions[].hold_begin.max_ms": str(HOLD_BEGIN_MAX_MS_DEFAULT),
    "tracing.enabled": "true" if TRACING_ENABLED_DEFAULT else "false",
    "tracing.api_keys": ", ".join(str(k) for k in DEFAULT_TRACED_API_KEYS),
}


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
        raise _file_error(source, "no such file; check the path") from None
    except IsADirectoryError:
        raise _file_error(source, "is a directory, not a rule file; give the file's path") from None
    except OSError as e:
        reason = e.strerror or str(e)
        message = f"cannot read the file ({reason}); check its permissions"
        raise _file_error(source, message) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RuleError(
            [
                RuleProblem(
                    source,
                    line,
                    FILE_KEY,
                    f"not valid UTF-8 (byte {e.start}); save the file as UTF-8",
                )
            ]
        ) from None
    # A UTF-8 round trip is lossless, so parse_rules hashes exactly the file's bytes.
    return parse_rules(text, source)


def parse_rules(text: str, source: str) -> RuleSet:
    """Validate rule-file ``text`` and return its model; ``source`` names it in messages.

    Pure: no I/O. Raises :class:`RuleError` listing every problem found.
    """
    # surrogatepass: a str with lone surrogates still hashes; the YAML reader rejects it.
    version = rules_version(text.encode("utf-8", "surrogatepass"))
    try:
        # The Reader checks the whole text for forbidden characters up front.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:
        raise RuleError([_reader_problem(source, text, e)]) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            raise RuleError([_syntax_problem(source, e)]) from None
        except yaml.reader.ReaderError as e:
            raise RuleError([_reader_problem(source, text, e)]) from None
        except RecursionError:
            raise _too_deep(source) from None
        checker = _Checker(source, loader)
        try:
            rule_set = checker.rule_set(root, version)
        except _BudgetExceeded:
            rule_set = None
        except RecursionError:
            # Only a very long chain of merge keys ('<<') can recurse this deep.
            raise _too_deep(source) from None
    finally:
        loader.dispose()
    if checker.problems or rule_set is None:
        raise RuleError(_in_file_order(checker.problems))
    return rule_set


def _too_deep(source: str) -> RuleError:
    message = "the YAML is nested too deeply to read; flatten the file"
    return RuleError([RuleProblem(source, 1, SYNTAX_KEY, message)])


def _file_error(source: str, message: str) -> RuleError:
    return RuleError([RuleProblem(source, 0, FILE_KEY, message)])


def _in_file_order(problems: list[RuleProblem]) -> list[RuleProblem]:
    # An anchor merged into several mappings is checked once per use: say things once.
    # Checks run section by section, so sort to read the file top to bottom (stable, so
    # problems on one line keep the order they were found in).
    return sorted(dict.fromkeys(problems), key=lambda problem: problem.line)


def _syntax_problem(source: str, e: yaml.MarkedYAMLError) -> RuleProblem:
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark else 1
    column = mark.column + 1 if mark else None
    problem = e.problem or "invalid YAML"
    if e.context:
        where = ""
        if e.context_mark is not None and e.context_mark is not mark:
            where = f" (line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
        problem = f"{e.context}{where}: {problem}"
    if "'\\t'" in problem:
        advice = "YAML does not allow tabs for indentation; indent with spaces"
    elif "another document" in problem:
        advice = "a rule file is a single YAML document; remove the extra '---'"
    else:
        advice = "fix the YAML syntax (check indentation, colons, brackets and quotes)"
    return RuleProblem(source, line, SYNTAX_KEY, f"{problem}; {advice}", column)


def _reader_problem(source: str, text: str, e: yaml.reader.ReaderError) -> RuleProblem:
    position = e.position if isinstance(e.position, int) else 0
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    character = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or " ")
    return RuleProblem(
        source,
        line,
        SYNTAX_KEY,
        f"character U+{character:04X} is not allowed in YAML; remove it",
        column,
    )


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _item(path: str, index: int) -> str:
    return f"{path}[{index}]"


def _line(node: Node) -> int:
    mark = node.start_mark
    return mark.line + 1 if mark is not None else 1


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL_TAG


def _yaml_text(value: object) -> str:
    # How a value is written in YAML, for messages; a repr would say True/None.
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    return str(value)


def _got(value: object) -> str:
    """Describe what was found, for "expected ..., got ..." messages."""
    if isinstance(value, SequenceNode | MappingNode):
        kind = "a list" if isinstance(value, SequenceNode) else "a mapping"
        if value.tag not in (_SEQ_TAG, _MAP_TAG):
            kind += f" tagged {_short_tag(value.tag)}"
        return kind
    if value is None:
        return "an empty value (null)"
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, int):
        kind = "an integer"
    elif isinstance(value, float):
        kind = "a number"
    elif isinstance(value, str):
        kind = "a string" if value else "an empty string"
    elif isinstance(value, datetime):
        kind = "a date and time"
    elif isinstance(value, date):
        kind = "a date"
    elif isinstance(value, bytes):
        return "binary data"
    else:
        kind = f"a {type(value).__name__}"
    return f"{_yaml_text(value)} ({kind})"


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    key_node: Node
    value: Node


@dataclass(frozen=True, slots=True)
class _Mapping:
    """A mapping that passed the structural checks: known keys only, each once."""

    node: Node
    path: str
    entries: dict[str, _Entry]

    def child(self, key: str) -> str:
        return _child(self.path, key)


class _Unreadable:
    """Marker for a scalar YAML could not construct (already reported)."""


_UNREADABLE = _Unreadable()


class _BudgetExceeded(Exception):
    """Raised once the file has expanded past _NODE_BUDGET; the problem is recorded."""


class _Checker:
    """Walks the node tree along the schema, collecting problems and building the model.

    Readers return the checked value, or None after recording a problem; callers then
    carry on with the default so that the rest of the file is still checked.
    """

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self.source = source
        self.problems: list[RuleProblem] = []
        self._loader = loader
        self._budget = _NODE_BUDGET

    # -- reporting -------------------------------------------------------------------

    def problem(self, node: Node, path: str, message: str) -> None:
        self.problems.append(RuleProblem(self.source, _line(node), path or TOP_LEVEL_KEY, message))

    def expected(self, node: Node, path: str, expected: str, value: object) -> None:
        message = f"expected {expected}, got {_got(value)}"
        if value is None:
            default = _DEFAULT_TEXT.get(re.sub(r"\[\d+\]", "[]", path))
            if default is not None:
                message += f"; remove the key to use the default ({default})"
            else:
                message += "; fill in a value"
        self.problem(node, path, message)

    def _spend(self, node: Node) -> None:
        self._budget -= 1
        if self._budget < 0:
            self.problem(
                node,
                FILE_KEY,
                f"the file expands to more than {_NODE_BUDGET} values (aliases reused "
                "many times?); write the rules out without repeated aliases",
            )
            # Anything reported after this (e.g. "missing key") would be noise.
            raise _BudgetExceeded

    # -- structure -------------------------------------------------------------------

    def scalar(self, node: Node, path: str) -> object:
        """The Python value of a scalar (as yaml.safe_load makes it), or the node itself."""
        if not isinstance(node, ScalarNode):
            return node
        try:
            return self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            detail = e.problem if isinstance(e, yaml.MarkedYAMLError) and e.problem else str(e)
            self.problem(
                node,
                path,
                f"cannot read this value with YAML tag {_short_tag(node.tag)} ({detail}); "
                "remove the tag or fix the value",
            )
            return _UNREADABLE

    def _collection_tag_ok(self, node: Node, path: str, tag: str) -> bool:
        if node.tag == tag:
            return True
        self.problem(
            node,
            path,
            f"unsupported YAML tag {_short_tag(node.tag)}; remove the tag",
        )
        return False

    def mapping(
        self,
        node: Node,
        path: str,
        expected: str,
        allowed: Sequence[str],
        required: Sequence[str] = (),
        null_ok: bool = False,
    ) -> _Mapping | None:
        """Check that ``node`` is a mapping with string keys, each once, all in ``allowed``.

        With ``null_ok`` an empty value stands for an empty mapping (all defaults), so a
        section whose keys are all commented out is still valid.
        """
        if null_ok and _is_null(node):
            return _Mapping(node, path, {})
        if not isinstance(node, MappingNode):
            value = self.scalar(node, path)
            if value is not _UNREADABLE:
                self.expected(node, path, expected, value)
            return None
        if not self._collection_tag_ok(node, path, _MAP_TAG):
            return None
        entries: dict[str, _Entry] = {}
        for entry in self._entries(node, path, set()):
            if entry.key in allowed:
                entries[entry.key] = entry
                continue
            message = f"unknown key {entry.key!r}"
            close = difflib.get_close_matches(entry.key, allowed, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
            message += f"; allowed keys here are: {', '.join(allowed)}"
            self.problem(entry.key_node, _child(path, entry.key), message)
        for key in required:
            if key not in entries:
                self.problem(
                    node,
                    _child(path, key),
                    f"missing required key {key!r}; add it to this entry",
                )
        # Report in file order even though merged keys were collected first.
        ordered = sorted(entries.values(), key=lambda e: _line(e.key_node))
        return _Mapping(node, path, {e.key: e for e in ordered})

    def _entries(self, node: MappingNode, path: str, merging: set[int]) -> list[_Entry]:
        """The key/value pairs of a mapping with YAML merge keys (``<<``) applied.

        Follows yaml.safe_load: explicit keys win over merged ones; within ``<<: [*a, *b]``
        the earlier mapping wins; of several ``<<`` keys the later wins. Duplicates are
        only an error between explicit keys, since overriding merged keys is the point.
        """
        explicit: dict[str, _Entry] = {}
        merged: dict[str, _Entry] = {}
        for key_node, value_node in node.value:
            self._spend(key_node)
            if key_node.tag == _MERGE_TAG:
                group: dict[str, _Entry] = {}
                for source in self._merge_sources(value_node, path, merging | {id(node)}):
                    for entry in self._entries(source, path, merging | {id(node)}):
                        group.setdefault(entry.key, entry)
                merged.update(group)
                continue
            key = self._key(key_node, path)
            if key is None:
                continue
            first = explicit.get(key)
            if first is not None:
                self.problem(
                    key_node,
                    _child(path, key),
                    f"duplicate key {key!r} (first given on line {_line(first.key_node)}); "
                    "YAML would silently use only the last one, so remove one of them",
                )
                continue
            explicit[key] = _Entry(key, key_node, value_node)
        return list({**merged, **explicit}.values())

    def _merge_sources(self, node: Node, path: str, merging: set[int]) -> list[MappingNode]:
        candidates = node.value if isinstance(node, SequenceNode) else [node]
        sources: list[MappingNode] = []
        for candidate in candidates:
            if isinstance(candidate, MappingNode) and candidate.tag == _MAP_TAG:
                if id(candidate) in merging:
                    self.problem(
                        candidate,
                        _child(path, "<<"),
                        "a merge key ('<<') merges a mapping into itself; remove it",
                    )
                else:
                    sources.append(candidate)
            else:
                self.problem(
                    candidate,
                    _child(path, "<<"),
                    "expected a mapping or a list of mappings to merge (e.g. '<<: *defaults'), "
                    f"got {_got(self.scalar(candidate, path))}",
                )
        return sources

    def _key(self, key_node: Node, path: str) -> str | None:
        if isinstance(key_node, ScalarNode) and key_node.tag == _STR_TAG:
            return str(key_node.value)
        value = self.scalar(key_node, path)
        if value is _UNREADABLE:
            return None
        shown = str(key_node.value) if isinstance(key_node, ScalarNode) else "?"
        self.problem(
            key_node,
            _child(path, shown),
            f"expected a key name (a string), got {_got(value)}; keys are names such as "
            "'topic', check the indentation",
        )
        return None

    def sequence(self, node: Node, path: str, expected: str) -> list[tuple[str, Node]] | None:
        """The items of a list with their key paths, or None if ``node`` is not a list."""
        if not isinstance(node, SequenceNode):
            value = self.scalar(node, path)
            if value is not _UNREADABLE:
                self.expected(node, path, expected, value)
            return None
        if not self._collection_tag_ok(node, path, _SEQ_TAG):
            return None
        items: list[tuple[str, Node]] = []
        for index, item in enumerate(node.value):
            self._spend(item)
            items.append((_item(path, index), item))
        return items

    def field(
        self,
        mapping: _Mapping,
        key: str,
        read: Callable[[Node, str], T | None],
        default: T,
    ) -> T | None:
        """Read an optional key: ``default`` if absent, None if present but invalid."""
        entry = mapping.entries.get(key)
        if entry is None:
            return default
        return read(entry.value, mapping.child(key))

    def required(
        self, mapping: _Mapping, key: str, read: Callable[[Node, str], T | None]
    ) -> T | None:
        """Read a required key; mapping() already reported it if missing."""
        entry = mapping.entries.get(key)
        if entry is None:
            return None
        return read(entry.value, mapping.child(key))

    # -- scalars -----------------------------------------------------------------------

    def _number_hint(self, node: Node, value: object) -> str:
        # '"2"' or '1e3' (YAML 1.1 needs a dot: 1.0e3) are text to YAML but clearly meant
        # as numbers; say how to write them.
        if not isinstance(value, str):
            return ""
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return ""
        if not math.isfinite(number):
            return ""
        plain = str(int(number)) if number.is_integer() else repr(number)
        if isinstance(node, ScalarNode) and node.style in ("'", '"'):
            return f"; remove the quotes: {plain}"
        return f"; YAML reads {value!r} as text, write the number as {plain}"

    def integer(self, node: Node, path: str, low: int, high: int | None = None) -> int | None:
        value = self.scalar(node, path)
        if value is _UNREADABLE:
            return None
        # bool is a subclass of int in Python but "true" is not a number in a rule file.
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value >= low
            and (high is None or value <= high)
        ):
            return value
        if high is None:
            expected = f"an integer >= {low}"
        else:
            expected = f"an integer between {low} and {high}"
        self.expected(node, path, expected, value)
        self._add_hint(self._number_hint(node, value))
        return None

    def number(self, node: Node, path: str, low: float) -> float | None:
        value = self.scalar(node, path)
        if value is _UNREADABLE:
            return None
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= low
        ):
            return float(value)
        self.expected(node, path, f"a number >= {low:g}", value)
        self._add_hint(self._number_hint(node, value))
        return None

    def _add_hint(self, hint: str) -> None:
        if hint:
            last = self.problems[-1]
            self.problems[-1] = RuleProblem(last.file, last.line, last.key, last.message + hint)

    def boolean(self, node: Node, path: str) -> bool | None:
        value = self.scalar(node, path)
        if value is _UNREADABLE:
            return None
        if isinstance(value, bool):
            return value
        self.expected(node, path, "true or false", value)
        return None

    def _text(self, node: Node, path: str, expected: str) -> tuple[str | None, object]:
        value = self.scalar(node, path)
        if value is _UNREADABLE:
            return None, value
        if isinstance(value, str) and value:
            return value, value
        self.expected(node, path, expected, value)
        if (
            isinstance(node, ScalarNode)
            and node.style is None
            and value is not None
            and not isinstance(value, str)
        ):
            # An unquoted 1_000, no or 2024-01-01 is not text to YAML; quoting fixes it.
            self._add_hint(f'; quote it to use it as text: "{node.value}"')
        return None, value

    def string(self, node: Node, path: str) -> str | None:
        return self._text(node, path, "a non-empty string")[0]

    def glob(self, node: Node, path: str) -> str | None:
        return self._text(node, path, "a glob pattern (a non-empty string such as 'orders.*')")[0]

    def topic(self, node: Node, path: str) -> str | None:
        name, value = self._text(node, path, _TOPIC_EXPECTED)
        if name is None:
            return None
        if _TOPIC_NAME_RE.fullmatch(name) is None or name in (".", ".."):
            self.expected(node, path, _TOPIC_EXPECTED, value)
            return None
        return name

    # -- the schema --------------------------------------------------------------------

    def rule_set(self, root: Node | None, version: str) -> RuleSet:
        if root is None or _is_null(root):
            # An empty file (or one with only comments) is a valid empty rule set.
            return RuleSet(source=self.source, version=version)
        top = self.mapping(
            root,
            "",
            f"a mapping with the sections {', '.join(_TOP_KEYS)}",
            _TOP_KEYS,
        )
        if top is None:
            return RuleSet(source=self.source, version=version)
        limits = self.field(top, "limits", self.limits, Limits())
        coalescing = self.field(top, "coalescing", self.coalescing, CoalescingRules())
        no_transactions: tuple[TransactionRule, ...] = ()
        transactions = self.field(top, "transactions", self.transactions, no_transactions)
        tracing = self.field(top, "tracing", self.tracing, Tracing())
        self.check_request_fits_frame(top, limits, coalescing)
        return RuleSet(
            source=self.source,
            version=version,
            # Fallbacks only matter when problems were found and no model is returned.
            limits=limits if limits is not None else Limits(),
            coalescing=coalescing if coalescing is not None else CoalescingRules(),
            transactions=transactions if transactions is not None else (),
            tracing=tracing if tracing is not None else Tracing(),
        )

    def limits(self, node: Node, path: str) -> Limits | None:
        m = self.mapping(node, path, "a mapping of limits", _LIMITS_KEYS, null_ok=True)
        if m is None:
            return None
        max_frame_bytes = self.field(
            m,
            "max_frame_bytes",
            lambda n, p: self.integer(n, p, MAX_FRAME_BYTES_MIN, MAX_FRAME_BYTES_MAX),
            MAX_FRAME_BYTES_DEFAULT,
        )
        max_connections = self.field(
            m,
            "max_connections",
            lambda n, p: self.integer(n, p, MAX_CONNECTIONS_MIN),
            MAX_CONNECTIONS_DEFAULT,
        )
        if max_frame_bytes is None or max_connections is None:
            return None
        return Limits(max_frame_bytes=max_frame_bytes, max_connections=max_connections)

    def coalescing(self, node: Node, path: str) -> CoalescingRules | None:
        m = self.mapping(
            node, path, "a mapping of coalescing settings", _COALESCING_KEYS, null_ok=True
        )
        if m is None:
            return None
        enabled = self.field(m, "enabled", self.boolean, COALESCING_ENABLED_DEFAULT)
        lanes = self.field(
            m, "lanes", lambda n, p: self.integer(n, p, LANES_MIN, LANES_MAX), LANES_DEFAULT
        )
        linger_ms = self.field(m, "linger_ms", lambda n, p: self.number(n, p, 0), LINGER_MS_DEFAULT)
        max_request_bytes = self.field(
            m,
            "max_request_bytes",
            lambda n, p: self.integer(n, p, MAX_REQUEST_BYTES_MIN, MAX_FRAME_BYTES_MAX),
            MAX_REQUEST_BYTES_DEFAULT,
        )
        no_rules: tuple[CoalescingRule, ...] = ()
        rules = self.field(m, "rules", self.coalescing_rules, no_rules)
        if (
            enabled is None
            or lanes is None
            or linger_ms is None
            or max_request_bytes is None
            or rules is None
        ):
            return None
        return CoalescingRules(
            enabled=enabled,
            lanes=lanes,
            linger_ms=linger_ms,
            max_request_bytes=max_request_bytes,
            rules=rules,
        )

    def coalescing_rules(self, node: Node, path: str) -> tuple[CoalescingRule, ...] | None:
        items = self.sequence(node, path, "a list of rules ({topic, client_id, coalesce})")
        if items is None:
            return None
        rules: list[CoalescingRule] = []
        ok = True
        for item_path, item in items:
            rule = self.coalescing_rule(item, item_path)
            if rule is None:
                ok = False
            else:
                rules.append(rule)
        return tuple(rules) if ok else None

    def coalescing_rule(self, node: Node, path: str) -> CoalescingRule | None:
        m = self.mapping(
            node,
            path,
            "a rule mapping with keys topic, client_id, coalesce",
            _COALESCING_RULE_KEYS,
            required=("coalesce",),
        )
        if m is None:
            return None
        topic = self.field(m, "topic", self.glob, "*")
        client_id = self.field(m, "client_id", self.glob, "*")
        coalesce = self.required(m, "coalesce", self.boolean)
        if topic is None or client_id is None or coalesce is None:
            return None
        return CoalescingRule(topic=topic, client_id=client_id, coalesce=coalesce)

    def transactions(self, node: Node, path: str) -> tuple[TransactionRule, ...] | None:
        items = self.sequence(
            node, path, "a list of transaction rules ({transactional_id, outputs, ...})"
        )
        if items is None:
            return None
        rules: list[TransactionRule] = []
        ok = True
        for item_path, item in items:
            rule = self.transaction_rule(item, item_path)
            if rule is None:
                ok = False
            else:
                rules.append(rule)
        return tuple(rules) if ok else None

    def transaction_rule(self, node: Node, path: str) -> TransactionRule | None:
        m = self.mapping(
            node,
            path,
            "a transaction rule mapping with keys " + ", ".join(_TRANSACTION_KEYS),
            _TRANSACTION_KEYS,
            required=("transactional_id", "outputs"),
        )
        if m is None:
            return None
        transactional_id = self.required(m, "transactional_id", self.glob)
        outputs = self.required(m, "outputs", self.outputs)
        consumer_group = self.field(m, "consumer_group", self.string, "")
        hold_begin = self.field(m, "hold_begin", self.hold_begin, HoldBegin())
        if (
            transactional_id is None
            or outputs is None
            or consumer_group is None
            or hold_begin is None
        ):
            return None
        return TransactionRule(
            transactional_id=transactional_id,
            outputs=outputs,
            # "" is the absent marker here: the reader never accepts an empty string.
            consumer_group=consumer_group or None,
            hold_begin=hold_begin,
        )

    def outputs(self, node: Node, path: str) -> tuple[TransactionOutput, ...] | None:
        items = self.sequence(node, path, "a list of outputs ({topic, partitions}), or []")
        if items is None:
            return None
        outputs: list[TransactionOutput] = []
        first_line: dict[str, tuple[str, int]] = {}
        ok = True
        for item_path, item in items:
            output = self.output(item, item_path)
            if output is None:
                ok = False
                continue
            if output.topic in first_line:
                where, line = first_line[output.topic]
                self.problem(
                    item,
                    _child(item_path, "topic"),
                    f"topic {output.topic!r} is already listed at {where} (line {line}); "
                    "list each topic once, with all its partitions",
                )
                ok = False
                continue
            first_line[output.topic] = (item_path, _line(item))
            outputs.append(output)
        return tuple(outputs) if ok else None

    def output(self, node: Node, path: str) -> TransactionOutput | None:
        m = self.mapping(
            node,
            path,
            "an output mapping with keys topic, partitions",
            _OUTPUT_KEYS,
            required=("topic",),
        )
        if m is None:
            return None
        topic = self.required(m, "topic", self.topic)
        entry = m.entries.get("partitions")
        partitions = None if entry is None else self.partitions(entry.value, m.child("partitions"))
        if topic is None or (entry is not None and partitions is None):
            return None
        return TransactionOutput(topic=topic, partitions=partitions)

    def partitions(self, node: Node, path: str) -> tuple[int, ...] | None:
        items = self.sequence(node, path, "a list of partition numbers")
        if items is None:
            return None
        if not items:
            self.problem(
                node,
                path,
                "expected at least one partition number, got an empty list; "
                "remove the key to mean every partition of the topic",
            )
            return None
        partitions: list[int] = []
        first: dict[int, str] = {}
        ok = True
        for item_path, item in items:
            partition = self.integer(item, item_path, 0, PARTITION_MAX)
            if partition is None:
                ok = False
                continue
            if partition in first:
                self.problem(
                    item,
                    item_path,
                    f"duplicate partition {partition} (already listed as {first[partition]}); "
                    "list each partition once",
                )
                ok = False
                continue
            first[partition] = item_path.rsplit(".", 1)[-1]
            partitions.append(partition)
        return tuple(partitions) if ok else None

    def hold_begin(self, node: Node, path: str) -> HoldBegin | None:
        m = self.mapping(
            node, path, "a mapping with the key max_ms", _HOLD_BEGIN_KEYS, null_ok=True
        )
        if m is None:
            return None
        max_ms = self.field(
            m,
            "max_ms",
            lambda n, p: self.integer(n, p, HOLD_BEGIN_MAX_MS_MIN, HOLD_BEGIN_MAX_MS_MAX),
            HOLD_BEGIN_MAX_MS_DEFAULT,
        )
        return None if max_ms is None else HoldBegin(max_ms=max_ms)

    def tracing(self, node: Node, path: str) -> Tracing | None:
        m = self.mapping(node, path, "a mapping of tracing settings", _TRACING_KEYS, null_ok=True)
        if m is None:
            return None
        enabled = self.field(m, "enabled", self.boolean, TRACING_ENABLED_DEFAULT)
        api_keys = self.field(m, "api_keys", self.api_keys, DEFAULT_TRACED_API_KEYS)
        if enabled is None or api_keys is None:
            return None
        return Tracing(enabled=enabled, api_keys=api_keys)

    def api_keys(self, node: Node, path: str) -> tuple[int | str, ...] | None:
        items = self.sequence(node, path, "a list of API keys (numbers or names)")
        if items is None:
            return None
        keys: list[int | str] = []
        ok = True
        for item_path, item in items:
            value = self.scalar(item, item_path)
            if value is _UNREADABLE:
                ok = False
            elif (isinstance(value, str) and value) or (
                isinstance(value, int)
                and not isinstance(value, bool)
                and API_KEY_MIN <= value <= API_KEY_MAX
            ):
                keys.append(value)
            else:
                self.expected(
                    item,
                    item_path,
                    f"an API key number between {API_KEY_MIN} and {API_KEY_MAX} "
                    "or an API name such as 'Produce'",
                    value,
                )
                ok = False
        return tuple(keys) if ok else None

    def check_request_fits_frame(
        self,
        top: _Mapping,
        limits: Limits | None,
        coalescing: CoalescingRules | None,
    ) -> None:
        # A coalesced request bigger than the frame limit could never be sent, so the two
        # settings are only valid together. Checked only when both sections were valid.
        if limits is None or coalescing is None:
            return
        if coalescing.max_request_bytes <= limits.max_frame_bytes:
            return
        advice = "lower coalescing.max_request_bytes or raise limits.max_frame_bytes"
        # Blame a key the file sets (max_request_bytes if both are set). A value that came
        # in through a merge key has no line of its own; then blame the top of the file.
        request_node = self._blame(top, "coalescing", "max_request_bytes")
        frame_node = self._blame(top, "limits", "max_frame_bytes")
        if frame_node is not None and request_node is None:
            self.problem(
                frame_node,
                "limits.max_frame_bytes",
                f"expected at least coalescing.max_request_bytes "
                f"({coalescing.max_request_bytes}), got {limits.max_frame_bytes}: "
                f"a coalesced request must fit in one frame; {advice}",
            )
        else:
            self.problem(
                request_node if request_node is not None else top.node,
                "coalescing.max_request_bytes",
                f"expected at most limits.max_frame_bytes ({limits.max_frame_bytes}), "
                f"got {coalescing.max_request_bytes}: a coalesced request must fit in one "
                f"frame; {advice}",
            )

    def _blame(self, top: _Mapping, section: str, key: str) -> Node | None:
        """The value node of ``section.key`` if the file writes it out directly."""
        entry = top.entries.get(section)
        if entry is None or not isinstance(entry.value, MappingNode):
            return None
        for key_node, value_node in entry.value.value:
            if isinstance(key_node, ScalarNode) and key_node.value == key:
                return value_node if isinstance(value_node, Node) else None
        return None
