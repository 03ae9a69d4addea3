"""What the rule-file tests (tests/test_rules_*.py) share: where the example file and
docs/rules.md are, the documented defaults, and a refused file's rendered problems."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kipside.rules import RuleError, RuleSet, parse_rules

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "rules" / "examples" / "kipside.yaml"
DOCS = REPO / "docs" / "rules.md"


def documented_default(key: str) -> Any:
    """The default that docs/rules.md's table of keys gives ``key``, read as YAML."""
    for line in DOCS.read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and cells[1] == f"`{key}`":
            return yaml.safe_load(cells[3].split("`")[1])
    raise AssertionError(f"docs/rules.md has no row for `{key}`")


# The documented default, so the model's own constant is checked against it, not with itself.
DEFAULT_API_KEYS = tuple(documented_default("api_keys"))


def problems_of(text: str, source: str = "kipside.yaml") -> str:
    """The rendered RuleError for ``text``; fails the test if the text is valid."""
    with pytest.raises(RuleError) as info:
        parse_rules(text, source)
    return str(info.value)


def content(rules: RuleSet) -> tuple[object, ...]:
    """What a rule set says, without where it came from (source and version)."""
    return (rules.limits, rules.coalescing, rules.transactions, rules.tracing)
