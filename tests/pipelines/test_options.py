"""Tests for pipeline.source.options: what a valid set of the `kipside` source's options becomes
(bootstrap servers, subscription, offsets and their precedence, limits, the client's and the
fetcher's settings), read as Spark's Kafka source (KafkaSourceProvider) reads them, with no
Kafka and no Spark session. Bad options are tested in test_options_errors.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kipside.pipeline.kafka.client import ClientConfig
from kipside.pipeline.kafka.fetcher import FetchConfig
from kipside.pipeline.kafka.retry import RetryPolicy
from kipside.pipeline.source.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    Subscription,
    parse_source_options,
)
from kipside.protocol import Address

from .options_kit import BOOTSTRAP, parse

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
