"""A rule file's YAML as plain data that remembers where each value was written.

PyYAML's ``SafeLoader`` composes the text into a node tree, and only the nodes know their
line. This module walks that tree into the dicts, lists and scalars ``yaml.safe_load``
would give (a scalar means exactly what ``safe_load`` makes of it: ``yes`` is a boolean,
``!!python/...`` is refused), plus a map from each key path to its nodes, so that a problem
found later in the data can be reported as ``FILE:LINE``. On the way it refuses what
``safe_load`` lets through silently: duplicate keys, non-string keys, and files that
aliases expand past a budget (the "billion laughs" pattern).

What the data cannot hold as a plain value is kept as a marker the schema never accepts:
an empty value (``NULL``, apart from None so that an optional field cannot take it for
"absent"), a list or mapping with a YAML tag (``Tagged``), and a scalar YAML could not
construct (``UNREADABLE``, already reported).

This module must never use an unsafe YAML loader, never do I/O, and never import trio,
sockets, ``kipside.proxy`` or ``kipside.pipeline``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kipside.rules.errors import FILE_KEY, SYNTAX_KEY, TOP_LEVEL_KEY, RuleError, RuleProblem

__all__ = [
    "NULL",
    "UNREADABLE",
    "Document",
    "Path",
    "Tagged",
    "Where",
    "describe",
    "got",
    "line_of",
    "read_document",
    "short_tag",
    "yaml_text",
]

Path = tuple[str | int, ...]

_YAML_TAG = "tag:yaml.org,2002:"
_MAP_TAG = _YAML_TAG + "map"
_SEQ_TAG = _YAML_TAG + "seq"
_STR_TAG = _YAML_TAG + "str"
_NULL_TAG = _YAML_TAG + "null"
_MERGE_TAG = _YAML_TAG + "merge"

# A real rule file is a few hundred values; this leaves room for thousands of partitions.
NODE_BUDGET = 1_000_000


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NULL = _Marker("NULL")
UNREADABLE = _Marker("UNREADABLE")


@dataclass(frozen=True, slots=True)
class Tagged:
    """A list or mapping written with a YAML tag (``!!set``, ``!!python/...``)."""

    kind: str  # "a list" or "a mapping"
    tag: str


def short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def got(value: object) -> str:
    """Describe what the file holds, for "expected ..., got ..." messages."""
    if isinstance(value, Tagged):
        if value.tag in (_MAP_TAG, _SEQ_TAG):
            return value.kind
        return f"{value.kind} tagged {short_tag(value.tag)}"
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    if value is NULL:
        return "an empty value (null)"
    if isinstance(value, bytes):
        return "binary data"
    kinds = [
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (datetime, "a date and time"),
        (date, "a date"),
    ]
    kind = next((name for cls, name in kinds if isinstance(value, cls)), None)
    if isinstance(value, str):
        kind = "a string" if value else "an empty string"
    return f"{yaml_text(value)} ({kind or 'a ' + type(value).__name__})"


def yaml_text(value: object) -> str:
    # How a value is written in YAML, for messages; a repr would say True/None.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    return str(value)


def describe(path: Path) -> str:
    """A key path as messages write it: ``transactions[0].outputs[1].partitions``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text or TOP_LEVEL_KEY


def line_of(node: Node | None) -> int:
    mark = node.start_mark if node is not None else None
    return mark.line + 1 if mark is not None else 1


@dataclass(frozen=True, slots=True)
class Where:
    """The nodes a value came from: its key's (None for list items) and its own."""

    key: Node | None
    value: Node


@dataclass
class Document:
    data: object = None
    where: dict[Path, Where] = field(default_factory=dict)
    problems: list[RuleProblem] = field(default_factory=list)


class _BudgetExceeded(Exception):
    pass


def read_document(text: str, source: str, omit_null: Callable[[Path], bool]) -> Document:
    """The data of rule-file ``text``; raises RuleError if it cannot be read as YAML at all.

    A mapping key whose value is empty is left out when ``omit_null(path)`` says so (an
    empty section means its defaults). Other problems are collected in the Document.
    """
    try:
        # The Reader checks the whole text for forbidden characters up front.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:
        raise RuleError([_reader_problem(source, text, e)]) from None
    try:
        root = loader.get_single_node()
        walk = _Walk(source, loader, omit_null)
        walk.document.data = {} if root is None else walk.value(root, (), None)
    except yaml.MarkedYAMLError as e:
        raise RuleError([_syntax_problem(source, e)]) from None
    except yaml.reader.ReaderError as e:
        raise RuleError([_reader_problem(source, text, e)]) from None
    except RecursionError:
        message = "the YAML is nested too deeply to read; flatten the file"
        raise RuleError([RuleProblem(source, 1, SYNTAX_KEY, message)]) from None
    except _BudgetExceeded:
        raise RuleError(walk.document.problems) from None
    finally:
        loader.dispose()
    return walk.document


def _syntax_problem(source: str, e: yaml.MarkedYAMLError) -> RuleProblem:
    mark = e.problem_mark or e.context_mark
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
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, None)
    return RuleProblem(source, line, SYNTAX_KEY, f"{problem}; {advice}", column)


def _reader_problem(source: str, text: str, e: yaml.reader.ReaderError) -> RuleProblem:
    position = e.position if isinstance(e.position, int) else 0
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    character = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or " ")
    message = f"character U+{character:04X} is not allowed in YAML; remove it"
    return RuleProblem(source, line, SYNTAX_KEY, message, column)


class _Walk:
    """Turns nodes into data, recording where each path was written and what is wrong."""

    def __init__(
        self, source: str, loader: yaml.SafeLoader, omit_null: Callable[[Path], bool]
    ) -> None:
        self.source = source
        self.document = Document()
        self._loader = loader
        self._omit_null = omit_null
        self._budget = NODE_BUDGET

    def problem(self, node: Node, path: Path, message: str, key: str | None = None) -> None:
        key = key or describe(path)
        self.document.problems.append(RuleProblem(self.source, line_of(node), key, message))

    def _spend(self, node: Node) -> None:
        # Aliases let a short file expand into a huge tree; everything after it walks the
        # expanded data, so stop here.
        self._budget -= 1
        if self._budget < 0:
            self.problem(
                node,
                (),
                f"the file expands to more than {NODE_BUDGET} values (aliases reused many "
                "times?); write the rules out without repeated aliases",
                FILE_KEY,
            )
            raise _BudgetExceeded

    def value(self, node: Node, path: Path, key: Node | None) -> object:
        self._spend(node)
        self.document.where[path] = Where(key, node)
        if isinstance(node, MappingNode):
            if node.tag != _MAP_TAG:
                return Tagged("a mapping", node.tag)
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                return Tagged("a list", node.tag)
            return [self.value(item, (*path, i), None) for i, item in enumerate(node.value)]
        return self.scalar(node, path)

    def scalar(self, node: Node, path: Path) -> object:
        if node.tag == _NULL_TAG:
            return NULL
        try:
            return self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            detail = e.problem if isinstance(e, yaml.MarkedYAMLError) and e.problem else str(e)
            self.problem(
                node,
                path,
                f"cannot read this value with YAML tag {short_tag(node.tag)} ({detail}); "
                "remove the tag or fix the value",
            )
            return UNREADABLE

    def _mapping(self, node: MappingNode, path: Path) -> dict[str, object]:
        data: dict[str, object] = {}
        for name, key_node, value_node in self._entries(node, path, frozenset()):
            child = (*path, name)
            if value_node.tag == _NULL_TAG and self._omit_null(child):
                continue
            data[name] = self.value(value_node, child, key_node)
        return data

    def _entries(
        self, node: MappingNode, path: Path, merging: frozenset[int]
    ) -> list[tuple[str, Node, Node]]:
        """The key/value pairs of a mapping with YAML merge keys (``<<``) applied.

        Follows yaml.safe_load: explicit keys win over merged ones; within ``<<: [*a, *b]``
        the earlier mapping wins; of several ``<<`` keys the later wins. Duplicates are
        only an error between explicit keys, since overriding merged keys is the point.
        """
        explicit: dict[str, tuple[str, Node, Node]] = {}
        merged: dict[str, tuple[str, Node, Node]] = {}
        merging = merging | {id(node)}
        for key_node, value_node in node.value:
            self._spend(key_node)
            if key_node.tag == _MERGE_TAG:
                group: dict[str, tuple[str, Node, Node]] = {}
                for source in self._merge_sources(value_node, path, merging):
                    for entry in self._entries(source, path, merging):
                        group.setdefault(entry[0], entry)
                merged.update(group)
                continue
            name = self._key(key_node, path)
            if name is None:
                continue
            if name in explicit:
                self.problem(
                    key_node,
                    (*path, name),
                    f"duplicate key {name!r} (first given on line "
                    f"{line_of(explicit[name][1])}); "
                    "YAML would silently use only the last one, so remove one of them",
                )
                continue
            explicit[name] = (name, key_node, value_node)
        # Report in file order even though merged keys were collected first.
        entries = {**merged, **explicit}.values()
        return sorted(entries, key=lambda entry: line_of(entry[1]))

    def _merge_sources(self, node: Node, path: Path, merging: frozenset[int]) -> list[MappingNode]:
        sources: list[MappingNode] = []
        for candidate in node.value if isinstance(node, SequenceNode) else [node]:
            if not isinstance(candidate, MappingNode) or candidate.tag != _MAP_TAG:
                self.problem(
                    candidate,
                    (*path, "<<"),
                    "expected a mapping or a list of mappings to merge (e.g. '<<: *defaults'), "
                    f"got {self._found(candidate, path)}",
                )
            elif id(candidate) in merging:
                message = "a merge key ('<<') merges a mapping into itself; remove it"
                self.problem(candidate, (*path, "<<"), message)
            else:
                sources.append(candidate)
        return sources

    def _key(self, key_node: Node, path: Path) -> str | None:
        if isinstance(key_node, ScalarNode) and key_node.tag == _STR_TAG:
            return str(key_node.value)
        found = self._found(key_node, path)
        if found is None:
            return None
        shown = str(key_node.value) if isinstance(key_node, ScalarNode) else "?"
        self.problem(
            key_node,
            (*path, shown),
            f"expected a key name (a string), got {found}; keys are names such as 'topic', "
            "check the indentation",
        )
        return None

    def _found(self, node: Node, path: Path) -> str | None:
        """What ``node`` holds, for messages; None if it cannot be read (reported)."""
        if isinstance(node, MappingNode | SequenceNode):
            return got(Tagged("a mapping" if isinstance(node, MappingNode) else "a list", node.tag))
        value = self.scalar(node, path)
        return None if value is UNREADABLE else got(value)
