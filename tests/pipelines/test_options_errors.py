"""Tests for pipeline.source.options: every bad option of the `kipside` source raises
OptionError naming the option in Spark's spelling, as Spark's Kafka source (KafkaSourceProvider)
checks them, with no Kafka and no Spark session.

Spark lower-cases option names before a data source sees them, so the error cases are one table:
the options, whether the query streams, and what the message must say. What a valid read
becomes is tested in test_options.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kipside.pipeline.source.options import OptionError, parse_source_options

from .options_kit import BASE, BASE_A, BOOTSTRAP, error

# ---- errors --------------------------------------------------------------------------------


def bad(name: str, options: dict[str, str], *fragments: str, stream: bool = False) -> Any:
    """One error case: the options given, whether the query streams, and what the message must
    say besides the name of every option given (test_errors checks those for each case)."""
    return pytest.param(options, stream, fragments, id=name)


# The options on top of BOOTSTRAP alone.
SUBSCRIPTION_ERRORS = [
    bad("subscription-missing", {}, "exactly one of", "subscribe", "none given"),
    bad("subscription-twice", {"Subscribe": "a", "ASSIGN": '{"a": [0]}'}, "exactly one of"),
    bad("subscribe-and-pattern", {"subscribe": "a", "subscribePattern": "a.*"}, stream=True),
    bad("subscribe-empty", {"SUBSCRIBE": " , "}, "no topics"),
    bad("subscribe-bad-topic", {"subscribe": "ok,not ok"}, "'not ok'", "legal"),
    bad("pattern-bad-regex", {"subscribePattern": "a("}, "regex"),
    bad("assign-not-a-list", {"assign": '{"a": 0}'}, "list of partition"),
    bad("assign-booleans", {"assign": '{"a": [true]}'}),
    bad("assign-empty", {"assign": "{}"}, '{"topicA": [0, 1]}'),
    bad("assign-bad-json", {"Assign": '{"a": [0,'}, "not valid JSON", "at character 9"),
]

# The options on top of BOOTSTRAP and subscribe=a.
OPTION_ERRORS = [
    bad(
        "starting-bad-json",
        {"StartingOffsets": '{"a": {"0": 1}'},
        "not valid JSON",
        "at character 14",
        stream=True,
    ),
    bad(
        "starting-not-json-nor-keyword",
        {"startingOffsets": "oldest"},
        "'oldest'",
        "not valid JSON",
        "at character 0",
        stream=True,
    ),
    bad(
        "starting-json-not-object",
        {"startingOffsets": "[1, 2]"},
        "JSON object of topics",
        stream=True,
    ),
    bad(
        "starting-topic-not-object",
        {"startingOffsets": '{"a": 5}'},
        "topic 'a'",
        "partition numbers",
        stream=True,
    ),
    bad(
        "starting-partition-not-number",
        {"startingOffsets": '{"a": {"x": 5}}'},
        "partition 'x'",
        "not a number",
        stream=True,
    ),
    bad(
        "starting-offset-minus-3",
        {"startingOffsets": '{"a": {"0": -3}}'},
        "a-0",
        "-3",
        "-2 or -1",
        stream=True,
    ),
    bad(
        "starting-offset-float", {"startingOffsets": '{"a": {"0": 1.5}}'}, "a-0", "1.5", stream=True
    ),
    bad(
        "starting-offset-bool",
        {"startingOffsets": '{"a": {"0": true}}'},
        "a-0",
        "True",
        stream=True,
    ),
    bad(
        "by-timestamp-negative",
        {"startingOffsetsByTimestamp": '{"a": {"0": -1}}'},
        "a-0",
        "-1",
        stream=True,
    ),
    bad(
        "starting-timestamp-not-number",
        {"startingTimestamp": "yesterday"},
        "'yesterday'",
        "whole number",
        stream=True,
    ),
    bad(
        "strategy-bad",
        {"startingOffsetsByTimestampStrategy": "nearest"},
        "'nearest'",
        "error or latest",
        stream=True,
    ),
    bad(
        "streaming-ending-offsets",
        {"EndingOffsets": "latest"},
        "not valid in streaming",
        stream=True,
    ),
    bad(
        "streaming-ending-by-timestamp",
        {"endingOffsetsByTimestamp": '{"a": {"0": 1}}'},
        "not valid in streaming",
        stream=True,
    ),
    bad(
        "streaming-ending-timestamp",
        {"endingTimestamp": "1"},
        "not valid in streaming",
        stream=True,
    ),
    bad("batch-starting-latest", {"startingOffsets": "latest"}, "latest", "batch"),
    bad("batch-ending-earliest", {"endingOffsets": "earliest"}, "earliest", "batch"),
    bad(
        "batch-starting-partition-latest",
        {"startingOffsets": '{"a": {"0": -1}}'},
        "a-0",
        "latest (-1)",
    ),
    bad(
        "batch-ending-partition-earliest",
        {"endingOffsets": '{"a": {"0": -2}}'},
        "a-0",
        "earliest (-2)",
    ),
    bad(
        "batch-partition-sets-differ",
        {"startingOffsets": '{"a": {"0": 1, "1": 1}}', "ENDINGOFFSETS": '{"a": {"0": 5}}'},
        "same partitions",
    ),
    bad(
        "batch-start-after-end",
        {"startingOffsets": '{"a": {"0": 9}}', "endingOffsets": '{"a": {"0": 5}}'},
        "a-0",
        "starts at 9",
        "after its end 5",
    ),
    bad(
        "batch-timestamps-start-after-end",
        {
            "startingOffsetsByTimestamp": '{"a": {"0": 9}}',
            "endingOffsetsByTimestamp": '{"a": {"0": 5}}',
        },
        "starts at 9",
    ),
    bad(
        "batch-timestamps-partition-sets-differ",
        {
            "startingOffsetsByTimestamp": '{"a": {"0": 1}}',
            "endingOffsetsByTimestamp": '{"b": {"0": 5}}',
        },
        "same partitions",
    ),
    bad(
        "max-offsets-and-bytes",
        {"maxOffsetsPerTrigger": "10", "maxBytesPerTrigger": "10"},
        "at most one",
        stream=True,
    ),
    bad("max-offsets-zero", {"maxOffsetsPerTrigger": "0"}, "below the minimum 1", stream=True),
    bad(
        "max-bytes-not-number",
        {"MaxBytesPerTrigger": "256M"},
        "'256M'",
        "whole number",
        stream=True,
    ),
    bad("min-partitions-zero", {"minPartitions": "0"}, "below the minimum 1"),
    bad("min-partitions-negative", {"minpartitions": "-4"}, "below the minimum 1"),
    bad("fail-on-data-loss-not-boolean", {"failOnDataLoss": "yes"}, "'yes'", "true or false"),
    bad("include-headers-not-boolean", {"INCLUDEHEADERS": "1"}, "'1'", "true or false"),
    bad(
        "isolation-level-bad",
        {"Kafka.Isolation.Level": "serializable"},
        "'serializable'",
        "read_committed or read_uncommitted",
    ),
    bad("rows-bad", {"Rows": "messages"}, "'messages'", "records or batches"),
    bad(
        "value-schema-with-batches",
        {"valueSchema": "id BIGINT", "rows": "batches"},
        "drop one of the two",
    ),
    bad(
        "columnar-key-file-missing",
        {"columnarKeyFile": "/nonexistent/keys.yaml"},
        "cannot read the key file /nonexistent/keys.yaml",
    ),
    bad("kafka-int-not-number", {"kafka.request.timeout.ms": "30s"}, "'30s'", "whole number"),
    bad("kafka-timeout-zero", {"Kafka.Request.Timeout.Ms": "0"}, "below the minimum 1"),
    bad(
        "kafka-fetch-bytes-too-small",
        {"kafka.max.partition.fetch.bytes": "100"},
        "below the minimum 1024",
    ),
    bad("kafka-fetch-wait-negative", {"kafka.fetch.max.wait.ms": "-1"}, "below the minimum 0"),
    bad(
        "unknown-with-hint",
        {"startingOfsets": "earliest"},
        "unknown option",
        "did you mean startingoffsets?",
    ),
    bad(
        "unknown-kafka-config-with-hint",
        {"kafka.fetch.max.wait": "5"},
        "unknown option",
        "did you mean kafka.fetch.max.wait.ms?",
    ),
    bad("unknown-without-hint", {"zzzzzz": "1"}, "unknown option", "Spark's Kafka source"),
    bad(
        "unsupported-max-records",
        {"maxRecordsPerPartition": "10"},
        "not supported by kipside",
        "use minPartitions",
    ),
    bad(
        "unsupported-auto-offset-reset",
        {"kafka.auto.offset.reset": "earliest"},
        "not supported",
        "startingOffsets",
    ),
    bad(
        "security-protocol-unknown",
        {"kafka.security.protocol": "TLS"},
        "must be one of",
        "SASL_SSL",
    ),
    bad(
        "sasl-without-sasl-protocol",
        {"kafka.sasl.mechanism": "PLAIN"},
        "is set but option kafka.security.protocol is PLAINTEXT",
        "SASL_SSL",
    ),
    bad(
        "unsupported-group-id-prefix",
        {"groupIdPrefix": "x"},
        "not supported",
        "consumer group",
        stream=True,
    ),
]


def check(
    base: Mapping[str, str], options: dict[str, str], streaming: bool, fragments: tuple[str, ...]
) -> None:
    message = error({**base, **options}, streaming=streaming).lower()
    # Spark lower-cases option names on their way to a data source, so however they were
    # written they come back in Spark's own spelling: compare without case.
    for fragment in (*options, *fragments):
        assert fragment.lower() in message, (fragment, message)


@pytest.mark.parametrize(("options", "streaming", "fragments"), SUBSCRIPTION_ERRORS)
def test_subscription_errors(
    options: dict[str, str], streaming: bool, fragments: tuple[str, ...]
) -> None:
    check(BOOTSTRAP, options, streaming, fragments)


@pytest.mark.parametrize(("options", "streaming", "fragments"), OPTION_ERRORS)
def test_option_errors(
    options: dict[str, str], streaming: bool, fragments: tuple[str, ...]
) -> None:
    check(BASE_A, options, streaming, fragments)


@pytest.mark.parametrize("servers", [None, "", "   "], ids=["missing", "empty", "blank"])
def test_bootstrap_servers_required(servers: str | None) -> None:
    options = {"subscribe": "a"}
    if servers is not None:
        options["kafka.bootstrap.servers"] = servers
    message = error(options)
    assert "kafka.bootstrap.servers must be set" in message


@pytest.mark.parametrize(
    ("servers", "fragment"),
    [("broker", "not HOST:PORT"), ("b:port", "'port'"), ("b:0", "outside 1..65535")],
)
def test_bootstrap_servers_malformed(servers: str, fragment: str) -> None:
    message = error({"kafka.bootstrap.servers": servers, "subscribe": "a"})
    assert "kafka.bootstrap.servers" in message
    assert fragment in message


def test_bootstrap_servers_with_only_separators_is_an_error() -> None:
    message = error({"kafka.bootstrap.servers": " , ,", "subscribe": "a"})
    assert "kafka.bootstrap.servers" in message


# However the option was written, messages name it in Spark's spelling (the docs' spelling).
SPELLING = [
    bad(
        "bootstrap",
        {"KAFKA.BOOTSTRAP.SERVERS": "nohost", "subscribe": "a"},
        "option kafka.bootstrap.servers",
    ),
    bad("batch-starting-latest", {**BASE, "STARTINGOFFSETS": "latest"}, "option startingOffsets"),
    bad("batch-ending-earliest", {**BASE, "ENDINGOFFSETS": "earliest"}, "option endingOffsets"),
    bad(
        "batch-starting-partition-latest",
        {**BASE, "startingoffsets": '{"orders": {"0": -1}}'},
        "option startingOffsets",
    ),
    bad(
        "max-offsets-and-bytes",
        {**BASE, "MAXOFFSETSPERTRIGGER": "1", "MAXBYTESPERTRIGGER": "1"},
        "maxOffsetsPerTrigger and maxBytesPerTrigger",
        stream=True,
    ),
]


@pytest.mark.parametrize(("options", "streaming", "spelled"), SPELLING)
def test_messages_name_the_option_in_sparks_spelling(
    options: dict[str, str], streaming: bool, spelled: tuple[str]
) -> None:
    assert spelled[0] in error(options, streaming=streaming)


def test_every_error_is_an_option_error_and_a_value_error() -> None:
    # Callers that catch ValueError (the CLI does) see option errors too.
    assert issubclass(OptionError, ValueError)
    with pytest.raises(ValueError, match="exactly one of"):
        parse_source_options(BOOTSTRAP, streaming=True)


def test_a_bad_key_file_is_named_with_its_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("write_key: a\nkeys:\n  a: not-base64!\n")
    message = error({**BASE_A, "columnarKeyFile": str(keys)}, streaming=True)
    assert message.startswith(f"option columnarKeyFile: {keys}:3: key 'a': not valid base64")
