"""Error types for kipside rule files.

A rule file is written by an operator and read by a tool, so every problem is reported as
one ``FILE:LINE: KEY: MESSAGE`` line: editors and CI logs can jump to it, and a person can
fix it without reading kipside's source. A file is checked completely before failing, so
one :class:`RuleError` carries every problem found in it, in file order.

This module must never import trio, sockets, ``kipside.proxy`` or ``kipside.pipeline``: the
rule model is pure data and is used by the CLI before any networking exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FILE_KEY", "NO_LINE", "SYNTAX_KEY", "TOP_LEVEL_KEY", "RuleError", "RuleProblem"]

# Placeholders used in the KEY position when a problem is not about one key. They are in
# parentheses so they can never be mistaken for a real dotted key path.
FILE_KEY = "(file)"
SYNTAX_KEY = "(syntax)"
TOP_LEVEL_KEY = "(top level)"
# The line of a problem no line can be blamed for (the file does not exist or cannot be
# read): FILE:0, as compilers write it.
NO_LINE = 0


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One problem in a rule file.

    ``line`` is 1-based. It is NO_LINE (0) only for problems about the file as a whole that
    no line can be blamed for (the file does not exist or cannot be read). ``column`` (1-based) is
    set only for YAML syntax errors, where the position inside the line matters.
    """

    file: str
    line: int
    key: str
    message: str
    column: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        if self.column is not None:
            where = f"{where}:{self.column}"
        return f"{where}: {self.key}: {self.message}"


class RuleError(ValueError):
    """A rule file is invalid; ``problems`` lists everything wrong with it (never empty)."""

    problems: list[RuleProblem]

    def __init__(self, problems: Iterable[RuleProblem]) -> None:
        self.problems = list(problems)
        if not self.problems:
            # An error without problems would print nothing and hide the real bug.
            raise ValueError("RuleError needs at least one problem")
        # args holds the list so the error pickles and unpickles through __init__.
        super().__init__(self.problems)

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.problems)
