"""Tests for the rule-file model (rules/): every kind of refused rule file, with the full text
of its problems (file:line, key, what was wrong, what to do).

Error messages are part of the interface (operators read them, `kipside rules check` prints
them), so the tests assert the full text of each kind of problem, file and line included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rules_kit import problems_of

from kipside.rules import RuleError, RuleProblem, load_rules

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
        "allowed keys here are: limits, coalescing, transactions, tracing, principals, topics",
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
        "coalescing, transactions, tracing, principals, topics, got a list",
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
        "allowed keys here are: limits, coalescing, transactions, tracing, principals, topics",
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
