"""A rule file's YAML as plain data that remembers where each value was written.

PyYAML's ``SafeLoader`` composes the text into nodes, and only nodes know their line. This
module walks them into the dicts, lists and scalars ``yaml.safe_load`` would give, plus a
map from each key path to its nodes, so a problem found later in the data is reported as
``FILE:LINE``. It refuses what ``safe_load`` lets through: duplicate keys, non-string keys,
and aliases that expand the file past a budget (the "billion laughs" pattern). What is no
plain value becomes a marker no schema type accepts: ``Marker.NULL`` (an empty value, kept
apart from None so an optional field cannot take it for "absent"), ``Marker.UNREADABLE``
(a scalar YAML could not construct, already reported) and ``Tagged`` (a tagged collection).

This module must never use an unsafe YAML loader, never do I/O, and never import trio,
sockets, ``kipside.proxy`` or ``kipside.pipeline``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kipside.rules.errors import FILE_KEY, SYNTAX_KEY, TOP_LEVEL_KEY, RuleError, RuleProblem

Path = tuple[str | int, ...]

_YAML_TAG = "tag:yaml.org,2002:"
_MAP_TAG, _SEQ_TAG = _YAML_TAG + "map", _YAML_TAG + "seq"
_STR_TAG, _NULL_TAG, _MERGE_TAG = _YAML_TAG + "str", _YAML_TAG + "null", _YAML_TAG + "merge"

# A real rule file is a few hundred values; this leaves room for thousands of partitions.
NODE_BUDGET = 1_000_000


class Marker(enum.Enum):
    NULL = "an empty value (null)"
    UNREADABLE = "a value YAML cannot read"


@dataclass(frozen=True, slots=True)
class Tagged:
    """A list or mapping written with a YAML tag (``!!set``, ``!!python/...``)."""

    kind: str  # "a list" or "a mapping"
    tag: str


def short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def got(value: object) -> str:
    """Describe what the file holds, for "expected ..., got ..." messages."""
    if isinstance(value, Marker):
        return value.value
    if isinstance(value, Tagged):
        plain = value.tag in (_MAP_TAG, _SEQ_TAG)
        return value.kind if plain else f"{value.kind} tagged {short_tag(value.tag)}"
    if isinstance(value, list | dict | bytes):
        return {list: "a list", dict: "a mapping", bytes: "binary data"}[type(value)]
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    kinds.update({datetime: "a date and time", date: "a date"})
    kind = "an empty string" if value == "" else kinds.get(type(value), "a value")
    return f"{yaml_text(value)} ({kind})"


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
    """The nodes a value came from: its key's (None for list items and the root) and its own."""

    key: Node | None
    value: Node


def read_document(text: str, source: str, omit_null: Callable[[Path], bool]) -> Document:
    """Rule-file ``text`` as data; raises RuleError if it cannot be read as YAML at all.

    A key whose value is empty is left out where ``omit_null(path)`` says so (an empty
    section means its defaults). Other problems are collected in the Document.
    """
    try:
        # The Reader checks the whole text for forbidden characters up front.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:
        raise RuleError([_reader_problem(source, text, e)]) from None
    document = Document(source, loader, omit_null)
    try:
        root = loader.get_single_node()
        _check_size(source, root)
        document.data = {} if root is None else document.value(root, (), None)
    except yaml.MarkedYAMLError as e:
        raise RuleError([_syntax_problem(source, e)]) from None
    except yaml.reader.ReaderError as e:
        raise RuleError([_reader_problem(source, text, e)]) from None
    except RecursionError:
        message = "the YAML is nested too deeply to read; flatten the file"
        raise RuleError([RuleProblem(source, 1, SYNTAX_KEY, message)]) from None
    finally:
        loader.dispose()
    return document


def _check_size(source: str, root: Node | None) -> None:
    """Refuse a file whose aliases expand it past NODE_BUDGET values, before expanding it."""
    sizes: dict[int, int] = {}

    def size(node: Node) -> int:
        if id(node) not in sizes:
            sizes[id(node)] = 0  # A node inside itself is the walk's to refuse, not a size.
            sizes[id(node)] = 1 + sum(size(child) for child in _children(node))
        return sizes[id(node)]

    if root is None or size(root) <= NODE_BUDGET:
        return
    # Blame the smallest part that is too big: where the aliases are reused.
    node = root
    while (inner := next((c for c in _children(node) if size(c) > NODE_BUDGET), None)) is not None:
        node = inner
    message = (
        f"the file expands to more than {NODE_BUDGET} values (aliases reused many times?); "
        "write the rules out without repeated aliases"
    )
    raise RuleError([RuleProblem(source, line_of(node), FILE_KEY, message)])


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [child for pair in node.value for child in pair]
    return list(node.value) if isinstance(node, SequenceNode) else []


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


class Document:
    """The data of a rule file, where each key path was written, and what is wrong in it."""

    def __init__(
        self, source: str, loader: yaml.SafeLoader, omit_null: Callable[[Path], bool]
    ) -> None:
        self.source = source
        self.data: object = None
        self.where: dict[Path, Where] = {}
        # Each with the path it is about: the schema decides which places are worth a word.
        self.problems: list[tuple[Path, RuleProblem]] = []
        self._loader = loader
        self._omit_null = omit_null

    def problem(self, node: Node, path: Path, message: str) -> None:
        problem = RuleProblem(self.source, line_of(node), describe(path), message)
        self.problems.append((path, problem))

    def value(self, node: Node, path: Path, key: Node | None) -> object:
        self.where[path] = Where(key, node)
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
            return Marker.NULL
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
            return Marker.UNREADABLE

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
        return None if value is Marker.UNREADABLE else got(value)
