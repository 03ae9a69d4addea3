"""Tests for the rule-file model (rules/): loading, validation messages, defaults, matching.

Error messages are part of the interface (operators read them, `kipside rules check` prints
them), so the tests assert the full text of each kind of problem, file and line included.
"""

from __future__ import annotations

import ast
import hashlib
import os
import pickle
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kipside.rules import (
    CoalescingRule,
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

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "rules" / "examples" / "kipside.yaml"
RULES_PACKAGE = REPO / "rules"

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


# --------------------------------------------------------------------------- error classes


def test_syntax_error_gives_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("coalescing:\n  lanes: 2\n  rules: [ {topic: a, coalesce: true}\n")
    with pytest.raises(RuleError) as info:
        load_rules(path)
    assert str(info.value) == (
        f"{path}:4:1: (syntax): while parsing a flow sequence (line 3, column 10): "
        "expected ',' or ']', but got '<stream end>'; "
        "fix the YAML syntax (check indentation, colons, brackets and quotes)"
    )
    [problem] = info.value.problems
    assert problem == RuleProblem(str(path), 4, "(syntax)", problem.message, column=1)


def refused(name: str, text: str, *problems: str) -> Any:
    """One refused rule file: its text and the problems it must be refused with, one a line,
    in file order, word for word."""
    return pytest.param(text, "\n".join(problems), id=name)


def _alias_bomb() -> str:
    """Ten levels of ten aliases of the level above: 10**10 values once expanded."""
    return "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(9)
    )


def _alias_reused() -> str:
    """One rule of 1000 partitions, reused 1000 times through an alias."""
    partitions = ", ".join(str(n) for n in range(1000))
    rule = f"{{transactional_id: t, outputs: [{{topic: a, partitions: [{partitions}]}}]}}"
    return f"transactions: [&r {rule}" + ", *r" * 1000 + "]\n"


REFUSED = [
    refused(
        "syntax_error_tab_indentation",
        "limits:\n\tmax_connections: 5\n",
        "kipside.yaml:2:1: (syntax): while scanning for the next token: found character "
        "'\\t' that cannot start any token; "
        "YAML does not allow tabs for indentation; indent with spaces",
    ),
    refused(
        "syntax_error_second_document",
        "limits: {}\n---\ntracing: {}\n",
        "kipside.yaml:2:1: (syntax): expected a single document in the stream "
        "(line 1, column 1): but found another document; "
        "a rule file is a single YAML document; remove the extra '---'",
    ),
    refused(
        "forbidden_character",
        "limits:\n  max_connections: 5\x07\n",
        "kipside.yaml:2:21: (syntax): character U+0007 is not allowed in YAML; remove it",
    ),
    refused(
        "duplicate_key",
        "coalescing:\n  lanes: 2\n  enabled: true\n  lanes: 4\n",
        "kipside.yaml:4: coalescing.lanes: duplicate key 'lanes' (first given on line 2); "
        "YAML would silently use only the last one, so remove one of them",
    ),
    refused(
        "duplicate_section",
        "tracing: {}\nlimits: {}\ntracing: {enabled: true}\n",
        "kipside.yaml:3: tracing: duplicate key 'tracing' (first given on line 1); "
        "YAML would silently use only the last one, so remove one of them",
    ),
    refused(
        "unknown_key_lists_allowed_keys",
        "coalescing:\n  lane: 3\n",
        "kipside.yaml:2: coalescing.lane: unknown key 'lane' (did you mean 'lanes'?); "
        "allowed keys here are: enabled, lanes, linger_ms, max_request_bytes, rules",
    ),
    refused(
        "unknown_key_lists_the_sections",
        "# rules\nlimit:\n  max_connections: 5\n",
        "kipside.yaml:2: limit: unknown key 'limit' (did you mean 'limits'?); "
        "allowed keys here are: limits, coalescing, transactions, tracing, principals",
    ),
    refused(
        "unknown_key_lists_the_transaction_keys",
        "transactions:\n  - transactional_id: a\n    outputs: []\n    group: g\n",
        "kipside.yaml:4: transactions[0].group: unknown key 'group'; allowed keys here are: "
        "transactional_id, outputs, consumer_group, hold_begin",
    ),
    refused(
        "non_string_key",
        "limits:\n  1: 2\n",
        "kipside.yaml:2: limits.1: expected a key name (a string), got 1 (an integer); "
        "keys are names such as 'topic', check the indentation",
    ),
    refused(
        "wrong_type",
        "coalescing:\n  lanes: two\n",
        "kipside.yaml:2: coalescing.lanes: expected an integer between 1 and 64, "
        "got 'two' (a string)",
    ),
    refused(
        "wrong_type_bool_is_not_an_integer",
        "limits:\n  max_connections: true\n",
        "kipside.yaml:2: limits.max_connections: expected an integer >= 1, got true (a boolean)",
    ),
    refused(
        "wrong_type_integer_is_not_a_bool",
        "tracing:\n  enabled: 1\n",
        "kipside.yaml:2: tracing.enabled: expected true or false, got 1 (an integer)",
    ),
    refused(
        "wrong_type_string_is_not_a_list",
        "transactions:\n  - transactional_id: a\n    outputs: orders\n",
        "kipside.yaml:3: transactions[0].outputs: expected a list of outputs "
        "({topic, partitions}), or [], got 'orders' (a string)",
    ),
    refused(
        "wrong_type_section_is_a_list",
        "limits:\n  - max_connections: 5\n",
        "kipside.yaml:2: limits: expected a mapping of limits, got a list",
    ),
    refused(
        "wrong_type_whole_file",
        "- limits\n",
        "kipside.yaml:1: (top level): expected a mapping with the sections limits, "
        "coalescing, transactions, tracing, principals, got a list",
    ),
    refused(
        "wrong_type_quoted_number_says_remove_the_quotes",
        "coalescing:\n  linger_ms: '5'\n",
        "kipside.yaml:2: coalescing.linger_ms: expected a number >= 0, got '5' (a string); "
        "remove the quotes: 5",
    ),
    # PyYAML (YAML 1.1) reads 1e3 as a string; 1.0e3 is the float.
    refused(
        "wrong_type_yaml_11_exponent",
        "coalescing:\n  linger_ms: 1e3\n",
        "kipside.yaml:2: coalescing.linger_ms: expected a number >= 0, got '1e3' (a string); "
        "YAML reads '1e3' as text, write the number as 1000",
    ),
    refused(
        "wrong_type_unquoted_topic_says_quote_it",
        "transactions:\n  - transactional_id: 2024\n    outputs: []\n",
        "kipside.yaml:2: transactions[0].transactional_id: expected a glob pattern "
        "(a non-empty string such as 'orders.*'), got 2024 (an integer); "
        'quote it to use it as text: "2024"',
    ),
    refused(
        "wrong_type_empty_value_says_remove_the_key",
        "coalescing:\n  lanes:\n",
        "kipside.yaml:2: coalescing.lanes: expected an integer between 1 and 64, "
        "got an empty value (null); remove the key to use the default (2)",
    ),
    refused(
        "unreadable_tagged_value",
        "coalescing:\n  lanes: !!int two\n",
        "kipside.yaml:2: coalescing.lanes: cannot read this value with YAML tag !!int "
        "(invalid literal for int() with base 10: 'two'); remove the tag or fix the value",
    ),
    # SafeLoader semantics: python/* tags are never constructed, wherever they appear.
    refused(
        "python_tags_are_refused_object_apply",
        "coalescing:\n  lanes: !!python/object/apply:os.system ['true']\n",
        "kipside.yaml:2: coalescing.lanes: expected an integer between 1 and 64, "
        "got a list tagged !!python/object/apply:os.system",
    ),
    refused(
        "python_tags_are_refused_name",
        "coalescing:\n  lanes: !!python/name:os.system\n",
        "kipside.yaml:2: coalescing.lanes: cannot read this value with YAML tag "
        "!!python/name:os.system (could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/name:os.system'); remove the tag or fix the value",
    ),
    refused(
        "python_tags_are_refused_object",
        "limits: !!python/object:os.Foo {}\n",
        "kipside.yaml:1: limits: unsupported YAML tag !!python/object:os.Foo; remove the tag",
    ),
    refused(
        "out_of_range_lanes",
        "coalescing:\n  lanes: 65\n",
        "kipside.yaml:2: coalescing.lanes: expected an integer between 1 and 64, "
        "got 65 (an integer)",
    ),
    refused(
        "out_of_range_frame_bytes",
        "limits:\n  max_frame_bytes: 1023\n",
        "kipside.yaml:2: limits.max_frame_bytes: expected an integer between 1024 and "
        "2147483647, got 1023 (an integer)",
    ),
    refused(
        "out_of_range_negative_linger",
        "coalescing:\n  linger_ms: -0.5\n",
        "kipside.yaml:2: coalescing.linger_ms: expected a number >= 0, got -0.5 (a number)",
    ),
    refused(
        "out_of_range_nan_linger",
        "coalescing:\n  linger_ms: .nan\n",
        "kipside.yaml:2: coalescing.linger_ms: expected a number >= 0, got nan (a number)",
    ),
    refused(
        "out_of_range_hold_begin",
        "transactions:\n- transactional_id: t\n  outputs: []\n  hold_begin: {max_ms: 300001}\n",
        "kipside.yaml:4: transactions[0].hold_begin.max_ms: expected an integer between 1 and "
        "300000, got 300001 (an integer)",
    ),
    refused(
        "out_of_range_api_key",
        "tracing:\n  api_keys: [Produce, 32768]\n",
        "kipside.yaml:2: tracing.api_keys[1]: expected an API key number between 0 and 32767 "
        "or an API name such as 'Produce', got 32768 (an integer)",
    ),
    refused(
        "out_of_range_request_larger_than_frame",
        "limits:\n  max_frame_bytes: 4096\ncoalescing:\n  max_request_bytes: 8192\n",
        "kipside.yaml:4: coalescing.max_request_bytes: expected at most "
        "limits.max_frame_bytes (4096), got 8192: a coalesced request must fit in one frame; "
        "lower coalescing.max_request_bytes or raise limits.max_frame_bytes",
    ),
    # Only the frame limit is set: blame it, against the default request size.
    refused(
        "out_of_range_frame_smaller_than_default_request",
        "limits:\n  max_frame_bytes: 4096\n",
        "kipside.yaml:2: limits.max_frame_bytes: expected at least "
        "coalescing.max_request_bytes (1048576), got 4096: a coalesced request must fit in "
        "one frame; lower coalescing.max_request_bytes or raise limits.max_frame_bytes",
    ),
    refused(
        "bad_glob_empty",
        "coalescing:\n  rules:\n    - topic: ''\n      coalesce: true\n",
        "kipside.yaml:3: coalescing.rules[0].topic: expected a glob pattern "
        "(a non-empty string such as 'orders.*'), got '' (an empty string)",
    ),
    refused(
        "bad_glob_a_list",
        "coalescing:\n  rules:\n    - client_id: [a, b]\n      coalesce: true\n",
        "kipside.yaml:3: coalescing.rules[0].client_id: expected a glob pattern "
        "(a non-empty string such as 'orders.*'), got a list",
    ),
    refused(
        "bad_topic_name",
        "transactions:\n  - transactional_id: t\n    outputs:\n      - topic: my topic\n",
        "kipside.yaml:4: transactions[0].outputs[0].topic: expected a Kafka topic name "
        "(1 to 249 of the characters a-z A-Z 0-9 . _ -), got 'my topic' (a string)",
    ),
    refused(
        "duplicate_partitions",
        "transactions:\n"
        "  - transactional_id: t\n"
        "    outputs:\n"
        "      - topic: a\n"
        "      - topic: b\n"
        "        partitions:\n"
        "          - 0\n"
        "          - 1\n"
        "          - 0\n",
        "kipside.yaml:9: transactions[0].outputs[1].partitions[2]: duplicate partition 0 "
        "(already listed as partitions[0]); list each partition once",
    ),
    refused(
        "empty_partitions",
        "transactions:\n- transactional_id: t\n  outputs: [{topic: a, partitions: []}]\n",
        "kipside.yaml:3: transactions[0].outputs[0].partitions: expected at least one "
        "partition number, got an empty list; "
        "remove the key to mean every partition of the topic",
    ),
    refused(
        "negative_partition",
        "transactions:\n- transactional_id: t\n  outputs: [{topic: a, partitions: [-1]}]\n",
        "kipside.yaml:3: transactions[0].outputs[0].partitions[0]: expected an integer between "
        "0 and 2147483647, got -1 (an integer)",
    ),
    refused(
        "every_repeat_is_reported",
        "transactions:\n"
        "- transactional_id: t\n"
        "  outputs:\n"
        "  - {topic: a, partitions: [1, 2, 1, 2]}\n"
        "  - {topic: a}\n",
        "kipside.yaml:4: transactions[0].outputs[0].partitions[2]: duplicate partition 1 "
        "(already listed as partitions[0]); list each partition once",
        "kipside.yaml:4: transactions[0].outputs[0].partitions[3]: duplicate partition 2 "
        "(already listed as partitions[1]); list each partition once",
    ),
    # The topics are checked once each output is valid on its own.
    refused(
        "every_repeat_is_reported_topics_once_outputs_are_valid",
        "transactions:\n"
        "- transactional_id: t\n"
        "  outputs:\n"
        "  - {topic: a, partitions: [1, 2]}\n"
        "  - {topic: a}\n",
        "kipside.yaml:5: transactions[0].outputs[1].topic: topic 'a' is already listed at "
        "transactions[0].outputs[0] (line 4); list each topic once, with all its partitions",
    ),
    # A list where a mapping belongs is one problem, whatever its items hold.
    refused(
        "inside_a_refused_value_nothing_more_is_said",
        "limits:\n- {1: 2, 3: !!int x}\n",
        "kipside.yaml:2: limits: expected a mapping of limits, got a list",
    ),
    refused(
        "inside_an_unknown_key_nothing_more_is_said",
        "limit:\n  1: 2\n",
        "kipside.yaml:1: limit: unknown key 'limit' (did you mean 'limits'?); "
        "allowed keys here are: limits, coalescing, transactions, tracing, principals",
    ),
    refused(
        "empty_optional_value_names_the_default",
        "transactions:\n- transactional_id: t\n  outputs: [{topic: a, partitions: }]\n",
        "kipside.yaml:3: transactions[0].outputs[0].partitions: expected a list of partition "
        "numbers, got an empty value (null); remove the key to use the default (every partition)",
    ),
    refused(
        "empty_required_value_says_fill_it_in",
        "transactions:\n- transactional_id:\n  outputs: []\n",
        "kipside.yaml:2: transactions[0].transactional_id: expected a glob pattern (a non-empty "
        "string such as 'orders.*'), got an empty value (null); fill in a value",
    ),
    refused(
        "duplicate_output_topic",
        "transactions:\n"
        "  - transactional_id: t\n"
        "    outputs:\n"
        "      - topic: a\n"
        "        partitions: [0]\n"
        "      - topic: a\n"
        "        partitions: [1]\n",
        "kipside.yaml:6: transactions[0].outputs[1].topic: topic 'a' is already listed at "
        "transactions[0].outputs[0] (line 4); list each topic once, with all its partitions",
    ),
    refused(
        "missing_required_key",
        "transactions:\n  - outputs: []\n    consumer_group: g\n",
        "kipside.yaml:2: transactions[0].transactional_id: missing required key "
        "'transactional_id'; add it to this entry",
    ),
    refused(
        "missing_required_key_in_a_coalescing_rule",
        "coalescing:\n  rules:\n    - topic: 'orders.*'\n",
        "kipside.yaml:3: coalescing.rules[0].coalesce: missing required key 'coalesce'; "
        "add it to this entry",
    ),
    # Refused at the first line whose list is too big, before anything is expanded.
    refused(
        "alias_bomb_is_refused_before_it_is_expanded",
        _alias_bomb(),
        "kipside.yaml:6: (file): the file expands to more than 1000000 values (aliases "
        "reused many times?); write the rules out without repeated aliases",
    ),
    refused(
        "alias_expansion_is_capped",
        _alias_reused(),
        "kipside.yaml:1: (file): the file expands to more than 1000000 values (aliases "
        "reused many times?); write the rules out without repeated aliases",
    ),
]


@pytest.mark.parametrize(("text", "problems"), REFUSED)
def test_refused(text: str, problems: str) -> None:
    assert problems_of(text) == problems


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
    assert rules.tracing == Tracing(enabled=False, api_keys=DEFAULT_API_KEYS)
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
    assert _content(again) == _content(rules)


# --------------------------------------------------------------------------- matching


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


# --------------------------------------------------------------------------- purity


# A rule file is data: the rules package is a pure model that never pulls in the shell.
_SHELL_MODULES = {"trio", "socket", "selectors", "ssl", "asyncio"}
_SHELL_PACKAGES = ("kipside.proxy", "kipside.pipeline")


def _is_shell(module: str) -> bool:
    parts = module.split(".")
    return parts[0] in _SHELL_MODULES or ".".join(parts[:2]) in _SHELL_PACKAGES


def test_shell_check_knows_the_real_names() -> None:
    assert _is_shell("trio") and _is_shell("socket") and _is_shell("asyncio.events")
    assert _is_shell("kipside.proxy") and _is_shell("kipside.pipeline.kafka")
    assert not _is_shell("kipside.protocol") and not _is_shell("kipside.rules.model")
    assert not _is_shell("kipside.proxyish") and not _is_shell("pydantic")


def test_rules_package_is_pure() -> None:
    """No shell imports (trio, sockets, proxy, pipeline), and no YAML loader but SafeLoader."""
    for path in sorted(RULES_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, (path, node.lineno, "imports are absolute")
                modules = [node.module or ""]
            else:
                modules = []
            for module in modules:
                assert not _is_shell(module), (path, module)
            if isinstance(node, ast.Attribute):
                assert node.attr not in {
                    "load",
                    "load_all",
                    "full_load",
                    "unsafe_load",
                    "Loader",
                    "FullLoader",
                    "UnsafeLoader",
                    "CLoader",
                    "CFullLoader",
                    "CUnsafeLoader",
                }, (path, node.lineno, node.attr)
    # What is loaded at run time, with the packages rules depends on. kio imports hypothesis
    # when it is installed (here, for the tests), and hypothesis's plugins import trio; a
    # deployment has no hypothesis, so leave its plugins out.
    code = (
        "import sys, kipside.rules; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'trio'"
        f" or '.'.join(m.split('.')[:2]) in {_SHELL_PACKAGES});"
        " assert not bad, bad"
    )
    env = {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)


# --------------------------------------------------------------------------- round trip

# PyYAML's emitter writes NEL/LS/PS raw inside quoted scalars with allow_unicode=True and its
# scanner then folds them ('\x85' comes back as ' '), so yaml.safe_load itself would not
# round-trip them. Lone surrogates cannot be encoded at all.
_TEXT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x85\u2028\u2029"),
    min_size=1,
    max_size=12,
)
_TOPIC = st.from_regex(r"[a-zA-Z0-9._-]{1,20}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)


@st.composite
def _rule_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid rule file as plain data, with a random subset of its optional keys."""
    data: dict[str, Any] = {}
    frame = 104_857_600
    if draw(st.booleans()):
        limits = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "max_frame_bytes": st.integers(1024, 2**31 - 1),
                    "max_connections": st.integers(1, 10**12),
                },
            )
        )
        frame = limits.get("max_frame_bytes", frame)
        data["limits"] = limits
    if draw(st.booleans()):
        rule = st.fixed_dictionaries(
            {"coalesce": st.booleans()}, optional={"topic": _TEXT, "client_id": _TEXT}
        )
        data["coalescing"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "enabled": st.booleans(),
                    "lanes": st.integers(1, 64),
                    "linger_ms": st.integers(0, 10**6)
                    | st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
                    "max_request_bytes": st.integers(1024, frame),
                    "rules": st.lists(rule, max_size=4),
                },
            )
        )
    if frame < 1_048_576:
        # The default max_request_bytes would not fit in the frame; say how much fits.
        data.setdefault("coalescing", {}).setdefault(
            "max_request_bytes", draw(st.integers(1024, frame))
        )
    if draw(st.booleans()):
        output = st.fixed_dictionaries(
            {"topic": _TOPIC},
            optional={
                "partitions": st.lists(
                    st.integers(0, 2**31 - 1), min_size=1, max_size=5, unique=True
                )
            },
        )
        required: dict[str, st.SearchStrategy[Any]] = {
            "transactional_id": _TEXT,
            "outputs": st.lists(output, max_size=3, unique_by=lambda o: str(o["topic"])),
        }
        optional: dict[str, st.SearchStrategy[Any]] = {
            "consumer_group": _TEXT,
            "hold_begin": st.fixed_dictionaries({}, optional={"max_ms": st.integers(1, 300_000)}),
        }
        transaction = st.fixed_dictionaries(required, optional=optional)
        data["transactions"] = draw(st.lists(transaction, max_size=3))
    if draw(st.booleans()):
        data["tracing"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "enabled": st.booleans(),
                    "api_keys": st.lists(st.integers(0, 32767) | _TEXT, max_size=6),
                },
            )
        )
    return data


def _expected(data: dict[str, Any]) -> RuleSet:
    """The model ``data`` should parse to, with the documented defaults spelled out here."""
    limits = data.get("limits", {})
    coalescing = data.get("coalescing", {})
    tracing = data.get("tracing", {})
    return RuleSet(
        limits=Limits(
            max_frame_bytes=limits.get("max_frame_bytes", 104_857_600),
            max_connections=limits.get("max_connections", 10_000),
        ),
        coalescing=CoalescingRules(
            enabled=coalescing.get("enabled", True),
            lanes=coalescing.get("lanes", 2),
            linger_ms=coalescing.get("linger_ms", 0),
            max_request_bytes=coalescing.get("max_request_bytes", 1_048_576),
            rules=tuple(
                CoalescingRule(
                    topic=r.get("topic", "*"),
                    client_id=r.get("client_id", "*"),
                    coalesce=r["coalesce"],
                )
                for r in coalescing.get("rules", [])
            ),
        ),
        transactions=tuple(
            TransactionRule(
                transactional_id=t["transactional_id"],
                outputs=tuple(
                    TransactionOutput(
                        topic=o["topic"],
                        partitions=tuple(o["partitions"]) if "partitions" in o else None,
                    )
                    for o in t["outputs"]
                ),
                consumer_group=t.get("consumer_group"),
                hold_begin=HoldBegin(max_ms=t.get("hold_begin", {}).get("max_ms", 5000)),
            )
            for t in data.get("transactions", [])
        ),
        tracing=Tracing(
            enabled=tracing.get("enabled", False),
            api_keys=tuple(tracing.get("api_keys", DEFAULT_API_KEYS)),
        ),
    )


def _content(rules: RuleSet) -> tuple[object, ...]:
    return (rules.limits, rules.coalescing, rules.transactions, rules.tracing)


@settings(deadline=None)
@given(
    data=_rule_dicts(),
    flow=st.sampled_from([None, True, False]),
    unicode=st.booleans(),
    sort_keys=st.booleans(),
)
def test_generated_rule_files_round_trip(
    data: dict[str, Any], flow: bool | None, unicode: bool, sort_keys: bool
) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=unicode, sort_keys=sort_keys)
    rules = parse_rules(text, "gen.yaml")
    assert yaml.safe_load(text) == data
    assert _content(rules) == _content(_expected(data))
    assert rules.version == hashlib.sha256(text.encode()).hexdigest()[:12]
    # describe() gives back the same data with every default filled in.
    body = {k: v for k, v in rules.describe().items() if k not in ("source", "version")}
    assert _content(parse_rules(yaml.safe_dump(body), "described.yaml")) == _content(rules)


_SCHEMA_WORDS = [
    "limits",
    "coalescing",
    "transactions",
    "tracing",
    "max_frame_bytes",
    "max_connections",
    "enabled",
    "lanes",
    "linger_ms",
    "max_request_bytes",
    "rules",
    "topic",
    "client_id",
    "coalesce",
    "transactional_id",
    "outputs",
    "partitions",
    "consumer_group",
    "hold_begin",
    "max_ms",
    "api_keys",
]
_ANY_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-10, 2**40)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(_SCHEMA_WORDS)
)
_ANY_TREE = st.recursive(
    _ANY_SCALAR,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_SCHEMA_WORDS) | st.integers(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(deadline=None)
@given(_ANY_TREE)
def test_any_document_gives_rules_or_rule_error(data: object) -> None:
    """Schema-shaped junk never crashes the checker: it is a RuleSet or a RuleError."""
    try:
        parse_rules(yaml.safe_dump(data), "junk.yaml")
    except RuleError as error:
        for problem in error.problems:
            assert problem.file == "junk.yaml"
            assert problem.line >= 1
            assert problem.key and problem.message


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
