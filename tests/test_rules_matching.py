"""Tests for the rule-file model (rules/): which coalescing rule and which transaction rule
applies to a request (first match wins, globs, the fallback)."""

from __future__ import annotations

from kipside.rules import CoalescingRule, CoalescingRules, parse_rules


def test_coalescing_first_matching_rule_wins() -> None:
    text = (
        "coalescing:\n"
        "  enabled: false\n"
        "  rules:\n"
        "    - {topic: 'audit.*', coalesce: false}\n"
        "    - {topic: 'audit.*', client_id: app, coalesce: true}\n"  # shadowed by the first
        "    - {topic: 'orders.?', client_id: 'app-[ab]', coalesce: true}\n"
        "    - {client_id: 'batch-*', coalesce: true}\n"
    )
    coalescing = parse_rules(text, "c.yaml").coalescing
    assert coalescing.applies("audit.log", "app") is False
    assert coalescing.applies("orders.1", "app-a") is True
    assert coalescing.applies("orders.12", "app-a") is False  # ? is exactly one character
    assert coalescing.applies("orders.1", "app-c") is False
    assert coalescing.applies("Orders.1", "app-a") is False  # case-sensitive
    assert coalescing.applies("anything/at all", "batch-") is True  # * may match nothing
    assert coalescing.applies("x", "") is False  # no client id; falls back to enabled


def test_client_without_client_id_matches_only_star() -> None:
    text = "coalescing:\n  enabled: false\n  rules:\n  - {client_id: '*', coalesce: true}\n"
    assert parse_rules(text, "c.yaml").coalescing.applies("t", None) is True
    narrow = parse_rules(text.replace("'*'", "'a*'"), "c.yaml").coalescing
    assert narrow.applies("t", None) is False
    assert narrow.applies("t", "ab") is True


def test_coalescing_enabled_is_the_fallback() -> None:
    on = CoalescingRules(enabled=True, rules=(CoalescingRule(topic="t", coalesce=False),))
    assert on.applies("t", "c") is False
    assert on.applies("u", "c") is True


def test_transaction_rule_first_match_wins() -> None:
    text = (
        "transactions:\n"
        "  - {transactional_id: 'test-*', outputs: []}\n"
        "  - {transactional_id: 'tx-[0-9]*', outputs: [{topic: a}], consumer_group: g}\n"
        "  - {transactional_id: '*', outputs: [{topic: b, partitions: [1, 0]}]}\n"
    )
    rules = parse_rules(text, "t.yaml")
    first, second, third = rules.transactions
    assert rules.transaction_rule_for("test-1") is first
    assert rules.transaction_rule_for("tx-9x") is second
    assert rules.transaction_rule_for("tx-x") is third
    assert rules.transaction_rule_for("") is third
    assert third.outputs[0].partitions == (1, 0)  # order kept as written
    assert parse_rules("transactions: []\n", "t.yaml").transaction_rule_for("x") is None
