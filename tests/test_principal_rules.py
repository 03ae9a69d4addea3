"""The rule file's `principals` section: first match wins, absent keys allow everything, and
the loader's FILE:LINE messages for it."""

from __future__ import annotations

import pytest

from kipside.rules import RuleError, parse_rules

RULES = """\
principals:
  - principal: "User:alice"
    topics: ["orders.*", "audit"]
    transactional_ids: ["orders-*"]
  - principal: "User:app-*"
    transactional_ids: []
"""


def test_lookup() -> None:
    rules = parse_rules(RULES, "p.yaml")
    alice = rules.principal_rule_for("User:alice")
    assert alice is not None
    assert alice.allows_topic("orders.eu") and alice.allows_topic("audit")
    assert not alice.allows_topic("audit.x") and not alice.allows_topic("payments")
    assert alice.allows_transactional_id("orders-1") and not alice.allows_transactional_id("x")
    app = rules.principal_rule_for("User:app-7")
    assert app is not None and app.allows_topic("anything")
    assert not app.allows_transactional_id("anything")  # [] allows none
    assert rules.principal_rule_for("User:bob") is None  # no entry: kipside restricts nothing
    assert rules.describe()["principals"][1] == {"principal": "User:app-*", "transactional_ids": []}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "principals:\n  - topics: [a]\n",
            "p.yaml:2: principals[0].principal: missing required key 'principal'",
        ),
        (
            "principals:\n  - principal: User:a\n    topic: [a]\n",
            "p.yaml:3: principals[0].topic: unknown key 'topic' (did you mean 'topics'?)",
        ),
        (
            "principals:\n  - principal: User:a\n    topics: orders.*\n",
            "p.yaml:3: principals[0].topics: expected a list of glob patterns",
        ),
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(RuleError) as refused:
        parse_rules(text, "p.yaml")
    assert str(refused.value).startswith(message), str(refused.value)
