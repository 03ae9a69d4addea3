"""Tests for the rule-file model (rules/): loading a rule file (file errors, all problems
together, defaults, the example file, describe()) and the documented error examples.

Error messages are part of the interface (operators read them, `kipside rules check` prints
them), so the tests assert the full text of each kind of problem, file and line included.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from rules_kit import DEFAULT_API_KEYS, DOCS, EXAMPLE, content, problems_of

from kipside.rules import (
    CoalescingRules,
    HoldBegin,
    Limits,
    RuleError,
    RuleProblem,
    RuleSet,
    Tracing,
    TransactionOutput,
    TransactionRule,
    default_rules,
    load_rules,
    parse_rules,
)


def test_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RuleError) as info:
        load_rules(missing)
    assert str(info.value) == f"{missing}:0: (file): no such file; check the path"
    assert info.value.problems == [
        RuleProblem(str(missing), 0, "(file)", "no such file; check the path")
    ]


def test_directory_is_not_a_rule_file(tmp_path: Path) -> None:
    with pytest.raises(RuleError) as info:
        load_rules(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}:0: (file): is a directory, not a rule file; give the file's path"
    )


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"limits:\n  max_connections: 5\n# caf\xe9\n")
    with pytest.raises(RuleError) as info:
        load_rules(path)
    assert str(info.value) == f"{path}:3: (file): not valid UTF-8 (byte 34); save the file as UTF-8"


# --------------------------------------------------------------------------- error collection


def test_all_problems_are_reported_together_in_file_order() -> None:
    text = (
        "limits:\n"  # 1
        "  max_frame_bytes: 10\n"  # 2
        "coalescing:\n"  # 3
        "  lanes: 0\n"  # 4
        "  lingr_ms: 5\n"  # 5
        "  rules:\n"  # 6
        "    - topic: ''\n"  # 7
        "      coalesce: yes\n"  # 8
        "transactions:\n"  # 9
        "  - transactional_id: 'tx-*'\n"  # 10
        "    outputs:\n"  # 11
        "      - topic: orders\n"  # 12
        "        partitions: [3, 3]\n"  # 13
        "    hold_begin: {max_ms: 0}\n"  # 14
        "  - outputs: []\n"  # 15
        "tracing:\n"  # 16
        "  enabled: 'yes'\n"  # 17
        "  enabled: true\n"  # 18
    )
    with pytest.raises(RuleError) as info:
        parse_rules(text, "r.yaml")
    assert str(info.value).splitlines() == [
        "r.yaml:2: limits.max_frame_bytes: expected an integer between 1024 and 2147483647, "
        "got 10 (an integer)",
        "r.yaml:4: coalescing.lanes: expected an integer between 1 and 64, got 0 (an integer)",
        "r.yaml:5: coalescing.lingr_ms: unknown key 'lingr_ms' (did you mean 'linger_ms'?); "
        "allowed keys here are: enabled, lanes, linger_ms, max_request_bytes, rules",
        "r.yaml:7: coalescing.rules[0].topic: expected a glob pattern (a non-empty string "
        "such as 'orders.*'), got '' (an empty string)",
        "r.yaml:13: transactions[0].outputs[0].partitions[1]: duplicate partition 3 "
        "(already listed as partitions[0]); list each partition once",
        "r.yaml:14: transactions[0].hold_begin.max_ms: expected an integer between 1 and "
        "300000, got 0 (an integer)",
        "r.yaml:15: transactions[1].transactional_id: missing required key "
        "'transactional_id'; add it to this entry",
        "r.yaml:17: tracing.enabled: expected true or false, got 'yes' (a string)",
        "r.yaml:18: tracing.enabled: duplicate key 'enabled' (first given on line 17); "
        "YAML would silently use only the last one, so remove one of them",
    ]
    assert len(info.value.problems) == 9
    assert all(isinstance(p, RuleProblem) for p in info.value.problems)


def test_rule_error_is_a_value_error_and_pickles() -> None:
    error = RuleError([RuleProblem("f.yaml", 3, "limits", "bad")])
    assert isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == "f.yaml:3: limits: bad"
    assert again.problems == error.problems
    with pytest.raises(ValueError):
        RuleError([])


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    rules = default_rules()
    assert rules == RuleSet()
    assert rules.source == "<defaults>"
    assert rules.version == hashlib.sha256(b"").hexdigest()[:12]
    assert rules.limits == Limits(max_frame_bytes=104_857_600, max_connections=10_000)
    assert rules.coalescing == CoalescingRules(
        enabled=True, lanes=2, linger_ms=0, max_request_bytes=1_048_576, rules=()
    )
    assert rules.transactions == ()
    assert rules.tracing == Tracing(enabled=True, api_keys=DEFAULT_API_KEYS)
    assert rules.coalescing.applies("any", "client")
    assert rules.transaction_rule_for("tx") is None


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "# only a comment\n", "---\n", "~\n", "limits:\ncoalescing:\ntracing:\n"],
)
def test_empty_file_and_empty_sections_mean_defaults(text: str) -> None:
    rules = parse_rules(text, "empty.yaml")
    assert rules.source == "empty.yaml"
    assert rules.version == hashlib.sha256(text.encode()).hexdigest()[:12]
    assert (rules.limits, rules.coalescing, rules.transactions, rules.tracing) == (
        Limits(),
        CoalescingRules(),
        (),
        Tracing(),
    )


def test_partial_sections_keep_other_defaults() -> None:
    text = (
        "coalescing: {lanes: 8}\n"
        "transactions:\n"
        "  - transactional_id: t\n"
        "    outputs: [{topic: a}]\n"
        "    hold_begin:\n"
    )
    rules = parse_rules(text, "p.yaml")
    assert rules.coalescing == CoalescingRules(lanes=8)
    assert rules.transactions == (
        TransactionRule(
            transactional_id="t",
            outputs=(TransactionOutput(topic="a", partitions=None),),
            consumer_group=None,
            hold_begin=HoldBegin(max_ms=5000),
        ),
    )


def test_load_rules_version_is_sha256_of_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    data = "\ufeff# caf\u00e9\r\ncoalescing: {linger_ms: 2.5}\r\n".encode()
    path.write_bytes(data)
    rules = load_rules(path)
    assert rules.version == hashlib.sha256(data).hexdigest()[:12]
    assert rules.source == str(path)
    assert rules.coalescing.linger_ms == 2.5


def test_yaml_merge_keys_follow_safe_load() -> None:
    text = (
        "transactions:\n"
        "  - transactional_id: a\n"
        "    outputs: []\n"
        "    hold_begin: &slow {max_ms: 9000}\n"
        "  - transactional_id: b\n"
        "    outputs: []\n"
        "    hold_begin:\n"
        "      <<: *slow\n"
        "  - transactional_id: c\n"
        "    outputs: []\n"
        "    hold_begin:\n"
        "      <<: *slow\n"
        "      max_ms: 10\n"
    )
    rules = parse_rules(text, "m.yaml")
    assert [t.hold_begin.max_ms for t in rules.transactions] == [9000, 9000, 10]
    assert yaml.safe_load(text)["transactions"][2]["hold_begin"] == {"max_ms": 10}


# --------------------------------------------------------------------------- the example


def test_example_file_loads_and_uses_every_section() -> None:
    rules = load_rules(EXAMPLE)
    data = yaml.safe_load(EXAMPLE.read_text())
    assert set(data) == {"limits", "coalescing", "transactions", "tracing"}
    # Every limit is in the example, with its default.
    assert data["limits"] == {f.name: getattr(Limits(), f.name) for f in fields(Limits) if f.init}
    assert set(data["coalescing"]) == {
        "enabled",
        "lanes",
        "linger_ms",
        "max_request_bytes",
        "rules",
    }
    assert set(data["tracing"]) == {"enabled", "api_keys"}
    transaction_keys = set().union(*(set(t) for t in data["transactions"]))
    assert transaction_keys == {"transactional_id", "outputs", "consumer_group", "hold_begin"}

    assert rules.source == str(EXAMPLE)
    assert rules.version == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()[:12]
    assert not rules.coalescing.applies("audit.logins", "web")
    assert not rules.coalescing.applies("payments", "billing-legacy-7")
    assert rules.coalescing.applies("orders.new", "billing-legacy-7") is False
    assert rules.coalescing.applies("orders.new", "web") is True
    processor = rules.transaction_rule_for("order-processor-3")
    assert processor is not None
    assert processor.consumer_group == "order-processor"
    assert processor.outputs[0] == TransactionOutput(
        topic="orders.confirmed", partitions=(0, 1, 2, 3)
    )
    assert processor.outputs[1].partitions is None
    exempt = rules.transaction_rule_for("test-1")
    assert exempt is not None and exempt.outputs == ()
    assert rules.tracing.api_keys == ("Produce", "Fetch", "EndTxn", 22)


def test_describe_is_plain_data_and_a_valid_rule_file() -> None:
    rules = load_rules(EXAMPLE)
    described = rules.describe()
    assert described["source"] == str(EXAMPLE)
    assert described["version"] == rules.version
    assert described["limits"] == {
        "max_frame_bytes": 104857600,
        "max_connections": 10000,
        "max_in_flight_bytes": 268435456,
        "max_in_flight_bytes_per_client": 16777216,
        "max_partitions_per_request": 100000,
        "max_tagged_fields": 64,
        "max_tagged_field_bytes": 1048576,
        "idle_timeout_ms": 600000,
        "request_read_timeout_ms": 60000,
    }
    assert described["transactions"][1] == {
        "transactional_id": "test-*",
        "outputs": [],
        "hold_begin": {"max_ms": 5000},
    }
    body = {k: v for k, v in described.items() if k not in ("source", "version")}
    # safe_dump refuses anything that is not plain data (tuples, dataclasses, ...).
    again = parse_rules(yaml.safe_dump(body), "again.yaml")
    assert content(again) == content(rules)


@pytest.mark.parametrize(
    "text",
    [
        "limits:\n  max_connections: 5\n- x\n",
        "limits:\n\tmax_connections: 5\n",
        "coalescing:\n  lanes: 2\n  enabled: true\n  lanes: 4\n",
        "coalescing:\n  lane: 3\n",
        "coalescing:\n  lanes: two\n",
        "coalescing:\n  lanes: 65\n",
        "coalescing:\n  linger_ms: '5'\n",
        "coalescing:\n  rules:\n    - topic: ''\n      coalesce: true\n",
        "coalescing:\n  rules:\n    - topic: no\n      coalesce: true\n",
        "transactions:\n  - transactional_id: t\n    outputs:\n      - topic: a\n"
        "      - topic: b\n        partitions:\n          - 0\n          - 1\n          - 0\n",
        "transactions:\n  - outputs: []\n",
        "limits:\n  max_frame_bytes: 4096\ncoalescing:\n  max_request_bytes: 8192\n",
    ],
)
def test_documented_error_examples_are_real(text: str) -> None:
    """Every example in docs/rules.md's error section is what kipside really prints."""
    assert problems_of(text) in DOCS.read_text().splitlines()
