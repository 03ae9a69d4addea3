"""The `kipside` source's options: Spark's Kafka source names, checked up front.

A user's code ports from `format("kafka")` by changing the format name, so the option names,
their JSON formats and their defaults are those of Spark's Kafka source (KafkaSourceProvider),
with two differences written down in docs/lake.md: kafka.isolation.level defaults to
read_committed, and `rows` (records or whole batches) and `maxBytesPerTrigger` are ours. Every
problem is an OptionError naming the option, what is wrong and what to write instead; an
option nobody knows is an error too (a typo must not silently change what is read). Spark
passes options case-insensitively, and so does this parser.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kipside.pipeline.kafka.client import ClientConfig
from kipside.pipeline.kafka.fetcher import FetchConfig
from kipside.pipeline.kafka.offsets import EARLIEST, LATEST, TopicPartition
from kipside.pipeline.kafka.retry import RetryPolicy
from kipside.pipeline.kafka.security import SECURITY_CONFIGS, SecurityConfigError, parse_security
from kipside.protocol import Address, ColumnarKeyFileError, ColumnarKeys

from .option_names import CANONICAL, KNOWN, UNSUPPORTED

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "OptionError",
    "SourceOptions",
    "Subscription",
    "load_key_file",
    "parse_source_options",
]

Rows = Literal["records", "batches"]


class OptionError(ValueError):
    """A source option is missing, unknown or malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """subscribe (topic list), subscribePattern (a regex matched against whole names) or
    assign (explicit partitions)."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribePattern":
            return f"subscribePattern {self.pattern!r}"
        if self.kind == "subscribe":
            return f"subscribe {','.join(self.topics)!r}"
        return f"assign {sorted(self.partitions)}"


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end: earliest/latest for all partitions, offsets or timestamps per
    partition (offsets may be EARLIEST/LATEST), or one timestamp for every partition."""

    kind: Literal["earliest", "latest", "offsets", "timestamps", "timestamp"]
    per_partition: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp: int | None = None
    option: str = ""
    """The option it came from, for error messages."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: tuple[Address, ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None
    no_match_latest: bool
    """startingOffsetsByTimestampStrategy=latest: a timestamp past the end starts at latest."""
    rows: Rows
    include_headers: bool
    max_offsets_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_partitions: int | None
    client: ClientConfig
    fetch: FetchConfig
    stop_marker: str | None = None
    """kipside.stopMarker: while this file exists, no new micro-batch starts (kipside's jobs
    use it to stop between micro-batches)."""
    notice_file: str | None = None
    """kipside.noticeFile: where the driver appends warnings for the job's terminal."""
    role: str = "Kafka cluster of option kafka.bootstrap.servers"
    """kipside.role: how errors name the cluster (kipside's jobs say "source cluster")."""
    value_schema: str | None = None
    """valueSchema: carriers' values as this struct's typed fields (Spark DDL, or a StructType's
    JSON; the data source keeps the JSON, which executors read without Spark's parser)."""
    columnar_key_file: str | None = None
    """columnarKeyFile: the key file (docs/columnar.md) for carriers' encrypted columns."""

    @property
    def committed_only(self) -> bool:
        return self.fetch.committed_only

    @property
    def fail_on_data_loss(self) -> bool:
        return self.fetch.fail_on_data_loss


_TOPIC_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class _Raw:
    """Options by lower-cased name; messages use Spark's spelling of each."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.values = {key.lower(): str(value) for key, value in options.items()}

    def name(self, key: str) -> str:
        return CANONICAL.get(key, key)

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def has(self, key: str) -> bool:
        return key in self.values

    def integer(self, key: str, *, minimum: int) -> int | None:
        text = self.get(key)
        if text is None:
            return None
        try:
            value = int(text.strip())
        except ValueError:
            raise OptionError(f"option {self.name(key)}: {text!r} is not a whole number") from None
        if value < minimum:
            raise OptionError(f"option {self.name(key)}: {value} is below the minimum {minimum}")
        return value

    def number(self, key: str, *, minimum: int, default: int) -> int:
        value = self.integer(key, minimum=minimum)
        return default if value is None else value

    def boolean(self, key: str, default: bool) -> bool:
        text = self.get(key)
        if text is None:
            return default
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise OptionError(f"option {self.name(key)}: {text!r} must be true or false")
        return lowered == "true"


def _check_known(raw: _Raw) -> None:
    for key in raw.values:
        if key in UNSUPPORTED:
            raise OptionError(
                f"option {raw.name(key)} of Spark's Kafka source is not supported by kipside: "
                f"{UNSUPPORTED[key]}"
            )
        if key not in KNOWN:
            close = difflib.get_close_matches(key, sorted(KNOWN), n=1)
            hint = f"; did you mean {raw.name(close[0])}?" if close else ""
            raise OptionError(
                f"unknown option {raw.name(key)}{hint} (the options are those of Spark's Kafka "
                "source; see docs/lake.md for the table)"
            )


def _json(raw: _Raw, key: str) -> Any:
    text = raw.get(key) or ""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {raw.name(key)}: {text!r} is not valid JSON ({exc.msg} at character "
            f'{exc.pos}); expected e.g. {{"topicA": {{"0": 23, "1": -2}}}}'
        ) from None


def _per_partition(
    raw: _Raw, key: str, *, allow: tuple[int, ...] = ()
) -> dict[TopicPartition, int]:
    """{"topic": {"0": n, ...}} -> {(topic, 0): n}; n >= 0 or one of `allow`."""
    value = _json(raw, key)
    name = raw.name(key)
    if not isinstance(value, dict) or not value:
        raise OptionError(f"option {name}: expected a JSON object of topics, got {raw.get(key)!r}")
    out: dict[TopicPartition, int] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(
                f"option {name}: topic {topic!r} must map partition numbers to values, e.g. "
                f'{{"{topic}": {{"0": 42}}}}'
            )
        for partition, number in partitions.items():
            try:
                index = int(partition)
            except ValueError:
                raise OptionError(
                    f"option {name}: partition {partition!r} of topic {topic!r} is not a number"
                ) from None
            if (
                isinstance(number, bool)
                or not isinstance(number, int)
                or (number < 0 and number not in allow)
            ):
                allowed = " or ".join(str(a) for a in allow)
                raise OptionError(
                    f"option {name}: {topic}-{index}: {number!r} is not a valid value "
                    f"(a whole number >= 0{', or ' + allowed if allow else ''})"
                )
            out[(topic, index)] = number
    return out


def _subscription(raw: _Raw) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if raw.has(k)]
    if len(given) != 1:
        what = "none" if not given else ", ".join(raw.name(k) for k in given)
        raise OptionError(
            f"exactly one of the options subscribe, subscribePattern, assign must be set ({what} "
            "given)"
        )
    key = given[0]
    text = (raw.get(key) or "").strip()
    if key == "subscribe":
        topics = tuple(t.strip() for t in text.split(",") if t.strip())
        if not topics:
            raise OptionError(f"option {raw.name(key)}: no topics in {text!r}")
        for topic in topics:
            if not _TOPIC_NAME.match(topic):
                raise OptionError(f"option {raw.name(key)}: {topic!r} is not a legal topic name")
        return Subscription("subscribe", topics=topics)
    if key == "subscribepattern":
        if not text:
            raise OptionError(f"option {raw.name(key)} is empty")
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(
                f"option {raw.name(key)}: {text!r} is not a valid regex: {exc}"
            ) from None
        return Subscription("subscribePattern", pattern=text)
    value = _json(raw, key)
    if not isinstance(value, dict) or not value:
        raise OptionError(
            f'option {raw.name(key)}: expected JSON like {{"topicA": [0, 1]}}, got {text!r}'
        )
    partitions: list[TopicPartition] = []
    for topic, indexes in value.items():
        if not isinstance(indexes, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indexes
        ):
            raise OptionError(
                f"option {raw.name(key)}: topic {topic!r} must map to a list of partition numbers"
            )
        partitions.extend((topic, i) for i in indexes)
    return Subscription("assign", partitions=tuple(sorted(set(partitions))))


def _offset_spec(raw: _Raw, *, prefix: str, default: OffsetSpec) -> OffsetSpec:
    """Spark's order of preference: <prefix>Timestamp, then <prefix>OffsetsByTimestamp, then
    <prefix>Offsets, then the default."""
    global_key, by_ts_key, offsets_key = (
        f"{prefix}timestamp",
        f"{prefix}offsetsbytimestamp",
        f"{prefix}offsets",
    )
    if raw.has(global_key):
        ts = raw.integer(global_key, minimum=0)
        return OffsetSpec("timestamp", timestamp=ts, option=raw.name(global_key))
    if raw.has(by_ts_key):
        return OffsetSpec("timestamps", _per_partition(raw, by_ts_key), option=raw.name(by_ts_key))
    text = raw.get(offsets_key)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        return OffsetSpec(lowered, option=raw.name(offsets_key))  # type: ignore[arg-type]
    return OffsetSpec(
        "offsets",
        _per_partition(raw, offsets_key, allow=(EARLIEST, LATEST)),
        option=raw.name(offsets_key),
    )


def _client_config(raw: _Raw) -> ClientConfig:
    retry = RetryPolicy(
        backoff_ms=raw.number("kafka.retry.backoff.ms", minimum=0, default=100),
        backoff_max_ms=raw.number("kafka.retry.backoff.max.ms", minimum=0, default=1000),
        timeout_ms=raw.number("kafka.default.api.timeout.ms", minimum=1, default=60_000),
    )
    given = {
        key.removeprefix("kafka."): value
        for key, value in raw.values.items()
        if key.removeprefix("kafka.") in SECURITY_CONFIGS and key.startswith("kafka.")
    }
    try:
        security = parse_security(given, lambda key: f"option kafka.{key}")
    except SecurityConfigError as exc:
        raise OptionError(str(exc)) from None
    return ClientConfig(
        security=security,
        settings_hint=raw.get("kipside.settingshint") or "option kafka.sasl.jaas.config",
        client_id=raw.get("kafka.client.id") or "kipside-source",
        connect_timeout_ms=raw.number(
            "kafka.socket.connection.setup.timeout.ms", minimum=1, default=10_000
        ),
        request_timeout_ms=raw.number("kafka.request.timeout.ms", minimum=1, default=30_000),
        retry=retry,
    )


def _fetch_config(raw: _Raw) -> FetchConfig:
    isolation = (raw.get("kafka.isolation.level") or "read_committed").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(
            f"option {raw.name('kafka.isolation.level')}: {isolation!r} must be read_committed or "
            "read_uncommitted"
        )
    defaults = FetchConfig()
    return FetchConfig(
        max_partition_fetch_bytes=raw.number(
            "kafka.max.partition.fetch.bytes",
            minimum=1024,
            default=defaults.max_partition_fetch_bytes,
        ),
        fetch_max_bytes=raw.number(
            "kafka.fetch.max.bytes", minimum=1024, default=defaults.fetch_max_bytes
        ),
        fetch_max_wait_ms=raw.number(
            "kafka.fetch.max.wait.ms", minimum=0, default=defaults.fetch_max_wait_ms
        ),
        committed_only=isolation == "read_committed",
        fail_on_data_loss=raw.boolean("failondataloss", True),
        marker_timeout_ms=raw.number(
            "kafka.transaction.marker.timeout.ms", minimum=1, default=defaults.marker_timeout_ms
        ),
        receive_message_max_bytes=raw.number(
            "kafka.receive.message.max.bytes",
            minimum=1000,
            default=defaults.receive_message_max_bytes,
        ),
    )


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check and convert the options of one `format("kipside")` read."""
    raw = _Raw(options)
    _check_known(raw)
    servers = raw.get("kafka.bootstrap.servers") or ""
    name = raw.name("kafka.bootstrap.servers")
    try:
        bootstrap = Address.parse_list(servers, what=f"option {name}")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if not bootstrap:
        raise OptionError(
            f"option {name} must be set, e.g. "
            '.option("kafka.bootstrap.servers", "broker-1:9092,broker-2:9092")'
        )
    subscription = _subscription(raw)
    starting = _offset_spec(
        raw, prefix="starting", default=OffsetSpec("latest" if streaming else "earliest")
    )
    ending: OffsetSpec | None = None
    if streaming:
        for key in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp"):
            if raw.has(key):
                raise OptionError(f"option {raw.name(key)} is not valid in streaming queries")
    else:
        ending = _offset_spec(raw, prefix="ending", default=OffsetSpec("latest"))
        _check_batch_offsets(starting, ending)
    strategy = (raw.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option {raw.name('startingoffsetsbytimestampstrategy')}: {strategy!r} must be error "
            "or latest"
        )
    rows = (raw.get("rows") or "records").strip().lower()
    if rows not in ("records", "batches"):
        raise OptionError(f"option {raw.name('rows')}: {rows!r} must be records or batches")
    value_schema = raw.get("valueschema")
    if value_schema is not None and rows == "batches":
        raise OptionError(
            f"option {raw.name('valueschema')} types records' values; with "
            f"{raw.name('rows')}=batches there are none: drop one of the two"
        )
    key_file = raw.get("columnarkeyfile")
    if key_file is not None:
        _check_key_file(raw.name("columnarkeyfile"), key_file)
    max_offsets = raw.integer("maxoffsetspertrigger", minimum=1)
    max_bytes = raw.integer("maxbytespertrigger", minimum=1)
    if max_offsets is not None and max_bytes is not None:
        raise OptionError(
            f"set at most one of {raw.name('maxoffsetspertrigger')} and "
            f"{raw.name('maxbytespertrigger')}"
        )
    return SourceOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        no_match_latest=strategy == "latest",
        rows=rows,  # type: ignore[arg-type]
        include_headers=raw.boolean("includeheaders", False),
        max_offsets_per_trigger=max_offsets,
        max_bytes_per_trigger=max_bytes,
        min_partitions=raw.integer("minpartitions", minimum=1),
        client=_client_config(raw),
        fetch=_fetch_config(raw),
        stop_marker=raw.get("kipside.stopmarker"),
        notice_file=raw.get("kipside.noticefile"),
        role=raw.get("kipside.role") or "Kafka cluster of option kafka.bootstrap.servers",
        value_schema=value_schema,
        columnar_key_file=key_file,
    )


def _check_key_file(option: str, path: str) -> None:
    """Read the key file now, so a problem stops the query before it reads (tasks read it again
    where they run)."""
    try:
        load_key_file(path)
    except OSError as exc:
        raise OptionError(
            f"option {option}: cannot read the key file {path}: {exc.strerror or exc}"
        ) from None
    except ColumnarKeyFileError as exc:
        raise OptionError(f"option {option}: {exc}") from None


def load_key_file(path: str) -> ColumnarKeys:
    """A columnar key file (protocol.ColumnarKeys). Raises OSError or ColumnarKeyFileError."""
    with open(path, encoding="utf-8") as file:
        return ColumnarKeys.parse(file.read(), path)


def _check_batch_offsets(starting: OffsetSpec, ending: OffsetSpec) -> None:
    start_name = starting.option or "startingOffsets"
    end_name = ending.option or "endingOffsets"
    if starting.kind == "latest":
        raise OptionError(f"option {start_name} can't be latest for batch queries")
    if ending.kind == "earliest":
        raise OptionError(f"option {end_name} can't be earliest for batch queries")
    for tp, offset in starting.per_partition.items():
        if starting.kind == "offsets" and offset == LATEST:
            raise OptionError(
                f"option {start_name}: {tp[0]}-{tp[1]} can't be latest (-1) in batch queries"
            )
    for tp, offset in ending.per_partition.items():
        if ending.kind == "offsets" and offset == EARLIEST:
            raise OptionError(f"option {end_name}: {tp[0]}-{tp[1]} can't be earliest (-2)")
    if starting.kind == ending.kind and starting.kind in ("offsets", "timestamps"):
        if set(starting.per_partition) != set(ending.per_partition):
            raise OptionError(
                f"options {starting.option} and {ending.option} must name the same partitions"
            )
        for tp, begin in starting.per_partition.items():
            end = ending.per_partition[tp]
            if begin >= 0 and end >= 0 and begin > end:
                raise OptionError(
                    f"options {starting.option}/{ending.option}: {tp[0]}-{tp[1]} starts at "
                    f"{begin}, after its end {end}"
                )
