"""The user documentation (README.md and docs/*.md) against the repository and the command line.

- test_links_resolve: every in-repository link (a relative file, a `#heading` of this or another
  document) names a file that exists and, for an anchor, a heading of that file, by GitHub's
  anchor rules (lowercase; punctuation other than `-` and `_` dropped; each space a `-`; a
  repeated heading gets `-1`, `-2`, ...).
- test_kipside_options_exist: every `--option` a document gives a `kipside` command (`kipside
  serve ...`, `.venv/bin/kipside dev ...`, `docker run ... kipside:0.1.0 serve ...`) is an
  option of that subcommand; every other `--option` is an option of some kipside subcommand,
  unless it belongs to another tool (kcat, pytest, docker, ...: named in the same command, code
  span or paragraph); a bench/ or test script's options (`.venv/bin/python bench/x.py --quick`)
  are declared in that script.

Fast and socket-free: the subcommands and their options come from `build_parser()` in this
process, a script's options from the option strings its source declares.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kipside.proxy.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w>-])")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
KIPSIDE = re.compile(r"^(?:\S*/)?kipside(?::[\w.-]+)?$")
SEPARATORS = re.compile(r"\|\||&&|[|;]|(?<=\s)&(?=\s|$)")
# A command (or, in prose, a word) that makes the options near it another tool's.
FOREIGN_COMMANDS = {
    "apt-get", "curl", "docker", "duplicates", "git", "grep", "haproxy", "kafka-console-consumer",
    "kafka-consumer-groups", "kafka-topics", "kcat", "kubectl", "lint-imports", "make", "mypy",
    "openssl", "otelcol", "otelcol-contrib", "pip", "pip3", "py-spy", "pytest", "ruff", "ssh",
    "spark-class", "spark-submit", "sudo", "tansu", "tcpdump", "tshark", "wc",
}  # fmt: skip
FOREIGN_WORDS = re.compile(
    r"(?<![\w-])(kcat|pytest|pip|spark-submit|spark-class|tcpdump|tshark|docker|kubectl|curl|"
    r"py-spy|otelcol|otelcol-contrib|kafka-topics|kafka-consumer-groups|duplicates|haproxy|"
    r"ruff|mypy|git|apt-get|tansu)(?![\w-])|bench/|\.py\b"
)
PROMPTS = {"$", "#", "%", ">", "(", "time", "exec", "env", "nohup"}
MISTYPED = re.compile(r"#\s*mistyped\b|: error: unrecognized option --")


# --------------------------------------------------------------------------- the documents


@dataclass(frozen=True)
class Unit:
    """A piece of a document to check options in: a code block's command line (continuation
    lines joined), an inline code span, or a prose line without its code spans."""

    doc: Path
    line: int
    text: str
    context: str
    """The paragraph (or table row) around a span or prose line; a code line's own text."""
    code: bool


def relative(doc: Path) -> str:
    return str(doc.relative_to(REPO))


def prose_lines(doc: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, inside a fenced code block) for every line of `doc`."""
    fence = ""
    for number, text in enumerate(doc.read_text().splitlines(), 1):
        opened = FENCE.match(text)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
                continue
            yield number, text, True
        elif opened:
            fence = opened.group(1)
        else:
            yield number, text, False


def units(doc: Path) -> Iterator[Unit]:
    lines = list(prose_lines(doc))
    paragraphs: dict[int, str] = {}
    block: list[tuple[int, str]] = []
    for number, text, code in [*lines, (0, "", False)]:
        if code or not text.strip() or text.lstrip().startswith("|"):
            for n, _ in block:
                paragraphs[n] = " ".join(t for _, t in block)
            block = []
            if not code and text.lstrip().startswith("|"):
                paragraphs[number] = text
        else:
            block.append((number, text))
    pending: tuple[int, str] | None = None
    for number, text, code in lines:
        if code:
            if pending is not None:
                number, text = pending[0], pending[1] + " " + text.strip()
            if text.rstrip().endswith("\\"):
                pending = (number, text.rstrip()[:-1])
                continue
            pending = None
            yield Unit(doc, number, text, text, True)
            continue
        pending = None
        context = paragraphs.get(number, text)
        for span in CODE_SPAN.finditer(text):
            yield Unit(doc, number, span.group(2), context, False)
        yield Unit(doc, number, CODE_SPAN.sub(" ", text), context, False)


# --------------------------------------------------------------------------- links


def plain_heading(text: str) -> str:
    """A heading as GitHub renders its text: code spans, links and emphasis reduced to text."""
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"<[^>]+>", "", text)


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text (before the -1, -2 of repeated headings)."""
    return re.sub(r"[^\w\- ]", "", plain_heading(text).strip().lower()).replace(" ", "-")


@cache
def anchors(doc: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, text, code in prose_lines(doc):
        if code:
            continue
        found.update(HTML_ANCHOR.findall(text))
        heading = HEADING.match(text)
        if heading:
            base = slug(heading.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(doc: Path) -> Iterator[tuple[int, str]]:
    for number, text, code in prose_lines(doc):
        if code:
            continue
        reference = REFERENCE.match(text)
        if reference:
            yield number, reference.group(1)
        for link in LINK.finditer(CODE_SPAN.sub(" ", text)):
            yield number, link.group(1)


def broken_link(doc: Path, target: str) -> str | None:
    """Why `target`, linked from `doc`, does not resolve; None when it does."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    where = (doc.parent / path).resolve() if path else doc
    if not where.exists():
        return f"no file {path!r}"
    if not where.is_relative_to(REPO):
        return f"{path!r} is outside the repository"
    if anchor and where.suffix == ".md" and anchor not in anchors(where):
        near = sorted(a for a in anchors(where) if a[:6] == anchor[:6])
        return f"{relative(where)} has no heading #{anchor}" + (f" (near: {near})" if near else "")
    return None


def test_links_resolve() -> None:
    problems = [
        f"{relative(doc)}:{line}: link {target!r}: {why}"
        for doc in DOCS
        for line, target in links(doc)
        if (why := broken_link(doc, target)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_slugs_follow_github() -> None:
    assert slug("TLS + SASL against a 3-broker cluster") == "tls--sasl-against-a-3-broker-cluster"
    assert slug("`kipside serve`") == "kipside-serve"
    assert slug("Test relays: tests/relaykit") == "test-relays-testsrelaykit"
    assert slug("TLS cost: kipside's CPU, both") == "tls-cost-kipsides-cpu-both"
    assert slug("5. Traces (OpenTelemetry)") == "5-traces-opentelemetry"


# --------------------------------------------------------------------------- options


@cache
def commands() -> dict[tuple[str, ...], frozenset[str]]:
    """Every kipside (sub)command, as the words that name it, and its option strings."""
    found: dict[tuple[str, ...], frozenset[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = frozenset(o for a in parser._actions for o in a.option_strings)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    walk(build_parser(), ())
    return found


def every_option() -> frozenset[str]:
    return frozenset().union(*commands().values())


@cache
def script_options(path: Path) -> frozenset[str]:
    """The option strings a script's source declares (a bench script's also bench/_report's)."""
    sources = [path] + ([REPO / "bench" / "_report.py"] if path.parent.name == "bench" else [])
    return frozenset(
        o for s in sources for o in re.findall(r"[\"'](--[a-z][a-z0-9-]*)", s.read_text())
    )


def segments(text: str) -> list[str]:
    """A shell line's commands: split at |, ;, &&, || and a lone &, except inside quotes."""
    masked = re.sub(r"'[^']*'|\"[^\"]*\"", lambda m: "x" * len(m.group(0)), text)
    cuts = [0, *(i for m in SEPARATORS.finditer(masked) for i in (m.start(), m.end())), len(text)]
    return [text[cuts[i] : cuts[i + 1]] for i in range(0, len(cuts), 2)]


def kipside_command(words: list[str]) -> tuple[int, tuple[str, ...]] | None:
    """Where a `kipside SUBCOMMAND` starts among `words` (its last word's index) and which."""
    names = commands()
    for i, word in enumerate(words):
        if not KIPSIDE.match(word):
            continue
        path: tuple[str, ...] = ()
        j = i + 1
        while j < len(words) and (*path, words[j].rstrip(":")) in names:
            path = (*path, words[j].rstrip(":"))
            j += 1
        if path:
            return j - 1, path
    return None


def command_word(words: list[str]) -> tuple[int, str]:
    """The first word of a command line that is not a prompt or a VAR=value, and its index."""
    for i, word in enumerate(words):
        if word in PROMPTS or re.match(r"^[A-Z_][A-Z0-9_]*=", word):
            continue
        return i, word.rsplit("/", 1)[-1]
    return len(words), ""


def misnamed(unit: Unit) -> Iterator[str]:
    """Each option of `unit` that is not where it says it is: a message naming it. A command
    that shows kipside refusing a mistyped option says so in a comment (`# mistyped`), and
    kipside's answer to it quotes the option it refused."""
    if MISTYPED.search(unit.text):
        return
    for segment in segments(unit.text) if unit.code else [unit.text]:
        if OPTION.search(segment):
            where = f"{relative(unit.doc)}:{unit.line}"
            for problem in segment_problems(unit, segment):
                yield f"{where}: {problem} (in: {segment.strip()!r})"


def segment_problems(unit: Unit, segment: str) -> Iterator[str]:
    """What is wrong with the options of one command (or prose line) of `unit`."""
    words = segment.split()
    found = kipside_command(words)
    if found is not None:
        at, path = found
        command = "kipside " + " ".join(path)
        for option in OPTION.findall(" ".join(words[at + 1 :])):
            if option not in commands()[path]:
                yield f"{option} is not an option of `{command}`"
        words = words[:at]  # what precedes it: `docker run ...`, a prompt, a variable
    first, name = command_word(words)
    if name.startswith("python"):
        script = words[first + 1] if first + 1 < len(words) else ""
        if script.endswith(".py"):
            yield from script_problems(script, words[first + 2 :])
        return
    if name in FOREIGN_COMMANDS or FOREIGN_WORDS.search(segment):
        return
    if not unit.code and FOREIGN_WORDS.search(unit.context):
        return
    for option in OPTION.findall(" ".join(words)):
        if option not in every_option():
            yield f"{option} is no option of any kipside command"


def script_problems(script: str, words: list[str]) -> Iterator[str]:
    """Options given to a script of the repository that it does not declare."""
    path = REPO / script.removeprefix("../")
    if not path.exists():
        yield f"no script {script}"
        return
    for option in OPTION.findall(" ".join(words)):
        if option not in script_options(path):
            yield f"{option} is not an option of {script}"


def test_kipside_options_exist() -> None:
    problems = [p for doc in DOCS for unit in units(doc) for p in misnamed(unit)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_wrong_option() -> None:
    doc = REPO / "docs" / "example.md"  # never written: units() is given its text below
    cases = {
        "`kipside dev --upstream 127.0.0.1:9092`": "is not an option of `kipside dev`",
        "    docker run kipside:0.1.0 serve --no-such-option": "of `kipside serve`",
        "Pass `--no-such-option` to make it so.": "no option of any kipside command",
        "`.venv/bin/python bench/throughput.py --no-such-option`": "of bench/throughput.py",
    }
    for text, expected in cases.items():
        code = text.startswith("    ")
        unit = Unit(doc, 1, text.strip().strip("`"), text, code)
        found = list(misnamed(unit))
        assert len(found) == 1 and expected in found[0], (text, found)
    mistyped = "$ kipside serve --upstream a --listne b   # mistyped: kipside names it"
    assert not list(misnamed(Unit(doc, 1, mistyped, mistyped, True)))
    fine = "`kipside serve --upstream b:9092 --listen 127.0.0.1:9092`, `kcat -b x -X y --foo`"
    for span in CODE_SPAN.finditer(fine):
        assert not list(misnamed(Unit(doc, 1, span.group(2), fine, False)))
