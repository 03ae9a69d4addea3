"""Counts of what a capture made the reading skip or guess, each declared once with its meaning.

A counts dataclass (reassembly's, the frames', the conversation's, the connection table's)
declares such a count as `name: int = skipped("what it counts")`. The summary's `skipped` reads
them by name (analyse.skipped_counts), and the report prints each count above zero followed by
that meaning: a new count is explained where it is declared, never in a second list.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

__all__ = ["meanings", "skipped", "skipped_values"]

_MEANING = "skipped"


def skipped(meaning: str) -> Any:
    """A count field, 0 to start, of something skipped or guessed; `meaning` is what the report
    prints after the number."""
    return field(default=0, metadata={_MEANING: meaning})


def meanings(counts: type, prefix: str = "") -> dict[str, str]:
    """The meaning of each skipped count of a counts dataclass, by name (`prefix` + field)."""
    return {prefix + f.name: f.metadata[_MEANING] for f in fields(counts) if _MEANING in f.metadata}


def skipped_values(counts: Any, prefix: str = "") -> dict[str, int]:
    """The value of each skipped count of a counts dataclass instance, by the same names."""
    return {
        prefix + f.name: getattr(counts, f.name) for f in fields(counts) if _MEANING in f.metadata
    }
