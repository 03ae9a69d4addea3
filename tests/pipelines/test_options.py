"""Tests for pipeline.source.options: the `kipside` source's options, checked as Spark's Kafka
source (KafkaSourceProvider) checks them, with no Kafka and no Spark session.

Every bad option must raise OptionError naming the option in Spark's spelling (Spark lower-cases
option names before a data source sees them), so the error
cases are one table: the options, whether the query streams, and what the message must say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from kipside.pipeline.kafka.client import ClientConfig
from kipside.pipeline.kafka.fetcher import FetchConfig
from kipside.pipeline.kafka.retry import RetryPolicy
from kipside.pipeline.source.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    SourceOptions,
    Subscription,
    parse_source_options,
)
from kipside.protocol import Address

BOOTSTRAP = {"kafka.bootstrap.servers": "broker-1:9092"}
BASE = {**BOOTSTRAP, "subscribe": "orders"}
BASE_A = {**BOOTSTRAP, "subscribe": "a"}


def parse(extra: Mapping[str, str] | None = None, *, streaming: bool = False) -> SourceOptions:
    return parse_source_options({**BASE, **(extra or {})}, streaming=streaming)


def error(options: Mapping[str, str], *, streaming: bool = False) -> str:
    with pytest.raises(OptionError) as info:
        parse_source_options(options, streaming=streaming)
    return str(info.value)


# ---- what a valid read becomes -------------------------------------------------------------


def test_defaults_of_a_batch_read() -> None:
    opts = parse()
    assert opts.bootstrap == (Address("broker-1", 9092),)
    assert opts.subscription == Subscription("subscribe", topics=("orders",))
    assert opts.starting.kind == "earliest"
    assert opts.ending is not None and opts.ending.kind == "latest"
    assert opts.rows == "records"
    assert opts.include_headers is False
    assert opts.max_offsets_per_trigger is None
    assert opts.max_bytes_per_trigger is None
    assert opts.min_partitions is None
    assert opts.no_match_latest is False
    # Ours, not Spark's: read_committed unless asked otherwise.
    assert opts.committed_only is True
    assert opts.fail_on_data_loss is True
    assert opts.client == ClientConfig(client_id="kipside-source")
    assert opts.fetch == FetchConfig()


def test_defaults_of_a_streaming_read() -> None:
    opts = parse(streaming=True)
    assert opts.starting.kind == "latest"
    assert opts.ending is None


def test_several_bootstrap_servers() -> None:
    opts = parse({"kafka.bootstrap.servers": " a:1, b:2 ,[::1]:3"})
    assert opts.bootstrap == (Address("a", 1), Address("b", 2), Address("::1", 3))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"subscribe": " a, b ,,c "}, Subscription("subscribe", topics=("a", "b", "c"))),
        (
            {"subscribePattern": "orders|payments"},
            Subscription("subscribePattern", pattern="orders|payments"),
        ),
        (
            {"assign": '{"b": [2, 0], "a": [1, 1]}'},
            Subscription("assign", partitions=(("a", 1), ("b", 0), ("b", 2))),
        ),
    ],
    ids=["subscribe", "subscribePattern", "assign"],
)
def test_subscriptions(options: dict[str, str], expected: Subscription) -> None:
    opts = parse_source_options({**BOOTSTRAP, **options}, streaming=True)
    assert opts.subscription == expected


@pytest.mark.parametrize(
    ("text", "streaming", "kind"),
    [("earliest", False, "earliest"), ("Earliest", True, "earliest"), (" LATEST ", True, "latest")],
    ids=["earliest-batch", "earliest-streaming", "latest-streaming"],
)
def test_starting_offsets_keywords(text: str, streaming: bool, kind: str) -> None:
    opts = parse({"startingOffsets": text}, streaming=streaming)
    assert opts.starting == OffsetSpec(kind, option="startingOffsets")  # type: ignore[arg-type]


def test_starting_offsets_json_with_earliest_and_latest_markers() -> None:
    opts = parse(
        {"startingOffsets": '{"orders": {"0": 23, "1": -2, "2": -1}, "other": {"7": 0}}'},
        streaming=True,
    )
    assert opts.starting.kind == "offsets"
    assert opts.starting.per_partition == {
        ("orders", 0): 23,
        ("orders", 1): EARLIEST,
        ("orders", 2): LATEST,
        ("other", 7): 0,
    }
    assert opts.starting.option == "startingOffsets"


def test_batch_offsets_json_on_both_ends() -> None:
    opts = parse(
        {
            "startingOffsets": '{"orders": {"0": 10, "1": -2}}',
            "endingOffsets": '{"orders": {"0": 20, "1": -1}}',
        }
    )
    assert opts.starting.per_partition == {("orders", 0): 10, ("orders", 1): EARLIEST}
    assert opts.ending is not None
    assert opts.ending.per_partition == {("orders", 0): 20, ("orders", 1): LATEST}


def test_offsets_by_timestamp() -> None:
    opts = parse(
        {
            "startingOffsetsByTimestamp": '{"orders": {"0": 1700000000000}}',
            "endingOffsetsByTimestamp": '{"orders": {"0": 1700000001000}}',
            "startingOffsetsByTimestampStrategy": "Latest",
        }
    )
    assert opts.starting == OffsetSpec(
        "timestamps", {("orders", 0): 1_700_000_000_000}, option="startingOffsetsByTimestamp"
    )
    assert opts.ending == OffsetSpec(
        "timestamps", {("orders", 0): 1_700_000_001_000}, option="endingOffsetsByTimestamp"
    )
    assert opts.no_match_latest is True


# Spark's order of preference: <x>Timestamp, then <x>OffsetsByTimestamp, then <x>Offsets.
PRECEDENCE = [
    (
        {
            "startingTimestamp": "1000",
            "startingOffsetsByTimestamp": '{"orders": {"0": 2000}}',
            "startingOffsets": '{"orders": {"0": 3}}',
        },
        OffsetSpec("timestamp", timestamp=1000, option="startingTimestamp"),
    ),
    (
        {
            "startingOffsetsByTimestamp": '{"orders": {"0": 2000}}',
            "startingOffsets": '{"orders": {"0": 3}}',
        },
        OffsetSpec("timestamps", {("orders", 0): 2000}, option="startingOffsetsByTimestamp"),
    ),
    # A lower-priority option is ignored, even one that would be an error on its own.
    (
        {"startingTimestamp": "1000", "startingOffsets": "latest"},
        OffsetSpec("timestamp", timestamp=1000, option="startingTimestamp"),
    ),
]


@pytest.mark.parametrize(
    ("options", "expected"), PRECEDENCE, ids=["timestamp", "by-timestamp", "hides-latest"]
)
def test_starting_precedence(options: dict[str, str], expected: OffsetSpec) -> None:
    assert parse(options).starting == expected


def test_ending_precedence() -> None:
    opts = parse(
        {
            "endingTimestamp": "5000",
            "endingOffsetsByTimestamp": '{"orders": {"0": 6000}}',
            "endingOffsets": "earliest",
        }
    )
    assert opts.ending == OffsetSpec("timestamp", timestamp=5000, option="endingTimestamp")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"maxOffsetsPerTrigger": "1000"}, (1000, None)),
        ({"maxBytesPerTrigger": "268435456"}, (None, 268435456)),
    ],
    ids=["offsets", "bytes"],
)
def test_read_limits(options: dict[str, str], expected: tuple[int | None, int | None]) -> None:
    opts = parse(options, streaming=True)
    assert (opts.max_offsets_per_trigger, opts.max_bytes_per_trigger) == expected


@pytest.mark.parametrize(("text", "expected"), [("true", True), (" FALSE ", False), ("True", True)])
def test_booleans(text: str, expected: bool) -> None:
    opts = parse({"failOnDataLoss": text, "includeHeaders": text})
    assert opts.fail_on_data_loss is expected
    assert opts.include_headers is expected


def test_isolation_level_read_uncommitted() -> None:
    assert parse({"kafka.isolation.level": "read_uncommitted"}).committed_only is False
    assert parse({"kafka.isolation.level": "read_committed"}).committed_only is True


# Spark's reader takes these and so do we (documented as ignored); `path` comes from load().
@pytest.mark.parametrize(
    "option", ["kafka.group.id", "kafka.session.timeout.ms", "kafka.client.rack", "path"]
)
def test_accepted_and_ignored_options(option: str) -> None:
    assert parse({option: "10"}).subscription.topics == ("orders",)


# A valid batch read with every option below set away from its default; the values Spark
# compares without case (rows, isolation level) written in another case.
EVERY_OPTION = {
    "kafka.bootstrap.servers": "a:1",
    "subscribePattern": "orders-.*",
    "startingOffsets": "earliest",
    "endingOffsets": '{"orders-1": {"0": 5}}',
    "minPartitions": "4",
    "kafka.isolation.level": "READ_UNCOMMITTED",
    "rows": "Batches",
    "kafka.client.id": "etl-7",
    "kafka.request.timeout.ms": "1234",
    "kafka.default.api.timeout.ms": "5678",
    "kafka.retry.backoff.ms": "11",
    "kafka.retry.backoff.max.ms": "22",
    "kafka.socket.connection.setup.timeout.ms": "333",
    "kafka.max.partition.fetch.bytes": "2048",
    "kafka.fetch.max.bytes": "4096",
    "kafka.fetch.max.wait.ms": "77",
    "kafka.transaction.marker.timeout.ms": "888",
}


def test_every_option_lands_in_its_setting() -> None:
    opts = parse_source_options(EVERY_OPTION, streaming=False)
    assert opts.bootstrap == (Address("a", 1),)
    assert opts.subscription == Subscription("subscribePattern", pattern="orders-.*")
    assert opts.starting.kind == "earliest"
    assert opts.ending == OffsetSpec("offsets", {("orders-1", 0): 5}, option="endingOffsets")
    assert opts.min_partitions == 4
    assert opts.committed_only is False
    assert opts.rows == "batches"
    assert opts.client == ClientConfig(
        client_id="etl-7",
        connect_timeout_ms=333,
        request_timeout_ms=1234,
        retry=RetryPolicy(backoff_ms=11, backoff_max_ms=22, timeout_ms=5678),
    )
    assert opts.fetch == FetchConfig(
        max_partition_fetch_bytes=2048,
        fetch_max_bytes=4096,
        fetch_max_wait_ms=77,
        committed_only=False,
        marker_timeout_ms=888,
    )


@pytest.mark.parametrize("spell", [str.upper, str.lower, str.swapcase, str.title])
def test_option_names_are_case_insensitive(spell: Callable[[str], str]) -> None:
    respelled = {spell(name): value for name, value in EVERY_OPTION.items()}
    assert parse_source_options(respelled, streaming=False) == parse_source_options(
        EVERY_OPTION, streaming=False
    )


def test_explicit_zero_is_kept_not_replaced_by_the_default() -> None:
    opts = parse(
        {
            "kafka.fetch.max.wait.ms": "0",
            "kafka.retry.backoff.ms": "0",
            "kafka.retry.backoff.max.ms": "0",
        }
    )
    assert opts.fetch.fetch_max_wait_ms == 0
    assert opts.client.retry.backoff_ms == 0
    assert opts.client.retry.backoff_max_ms == 0


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
        "unsupported-security", {"Kafka.Security.Protocol": "SSL"}, "not supported", "TLS and SASL"
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
