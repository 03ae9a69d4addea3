"""kipside's rule files: a pure, validated model of the operator's YAML configuration.

``load_rules(path)`` reads and validates one rule file, ``parse_rules(text, source)`` does
the same for text already in memory, and ``default_rules()`` is what an empty file means.
The result is an immutable :class:`RuleSet`; anything wrong with a file is raised as one
:class:`RuleError` listing every problem as ``FILE:LINE: KEY: MESSAGE``. The schema is
documented in docs/rules.md, and rules/examples/kipside.yaml uses every section.

This package must never import trio, sockets, ``kipside.proxy`` or ``kipside.pipeline``,
never do I/O other than reading the rule file it is asked to load (and the schema and key
files a columnar rule names), and never use an unsafe YAML loader: the proxy depends on the
rules, not the other way round, and a rule file is data, not code. Other packages import only
the names in ``__all__``.
"""

from kipside.rules.errors import FILE_KEY, NO_LINE, RuleError, RuleProblem
from kipside.rules.loader import default_rules, load_rules, parse_rules
from kipside.rules.model import (
    DEFAULT_SOURCE,
    CoalescingRule,
    CoalescingRules,
    ColumnarEncryption,
    ColumnarRule,
    HoldBegin,
    Limits,
    PrincipalRule,
    RuleSet,
    TopicRule,
    Tracing,
    TransactionOutput,
    TransactionRule,
)

__all__ = [
    "DEFAULT_SOURCE",
    "FILE_KEY",
    "NO_LINE",
    "CoalescingRule",
    "CoalescingRules",
    "ColumnarEncryption",
    "ColumnarRule",
    "HoldBegin",
    "Limits",
    "PrincipalRule",
    "RuleError",
    "RuleProblem",
    "RuleSet",
    "TopicRule",
    "Tracing",
    "TransactionOutput",
    "TransactionRule",
    "default_rules",
    "load_rules",
    "parse_rules",
]
