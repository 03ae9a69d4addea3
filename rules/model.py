"""The in-memory model of a kipside rule file: frozen, slotted dataclasses and pure lookups.

The dataclasses are also the rule file's schema. Each field's type says what the file may
write there (``Annotated`` bounds, strict scalars: ``true`` is not an integer), its default
is what a missing key means, and each class refuses keys it does not have. pydantic reads
these types when :func:`kipside.rules.parse_rules` checks a file, so keys, bounds and
defaults are written once, here. Built directly (``RuleSet()``, ``Limits(...)``) the
classes check nothing: the loader is the validating constructor.

This module must never do I/O and never import trio, sockets, ``kipside.proxy`` or
``kipside.pipeline``; the proxy reads a ``RuleSet`` but the ``RuleSet`` knows nothing about
the proxy. It may use ``kipside.protocol``'s constants and plain models: a frame cap is the
protocol's, and so are a value schema and a columnar key file once read.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from annotated_types import Ge, Interval, MinLen
from pydantic import (
    AfterValidator,
    AllowInfNan,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    with_config,
)
from pydantic_core import PydanticCustomError

from kipside.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ColumnarKeys,
    ColumnarOptions,
    DecodeLimits,
    ValueSchema,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DEFAULT_SOURCE",
    "DEFAULT_TRACED_API_KEYS",
    "DEFAULT_VERSION",
    "CoalescingRule",
    "CoalescingRules",
    "ColumnarEncryption",
    "ColumnarRule",
    "HoldBegin",
    "Limits",
    "PrincipalRule",
    "RuleSet",
    "TopicRule",
    "Tracing",
    "TransactionOutput",
    "TransactionRule",
    "rules_version",
]

INT32_MAX = 2_147_483_647  # Frame sizes and partition ids are signed 32-bit on the wire.
API_KEY_MAX = 32_767  # API keys are int16 on the wire.

DEFAULT_TRACED_API_KEYS: tuple[int | str, ...] = (
    "Produce",
    "Fetch",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "TxnOffsetCommit",
    "InitProducerId",
)

DEFAULT_SOURCE = "<defaults>"


def rules_version(data: bytes) -> str:
    """The version tag of a rule file: the first 12 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()[:12]


# The built-in defaults are exactly what an empty rule file means, so they share its version.
DEFAULT_VERSION = rules_version(b"")


def _compile_glob(pattern: str) -> re.Pattern[str]:
    # fnmatchcase semantics (case-sensitive on every platform: Kafka names are
    # case-sensitive), compiled once per rule because matching runs per request.
    return re.compile(fnmatch.translate(pattern))


def _kafka_topic_name(name: str) -> str:
    # Kafka's own rule (kafka.common.internals.Topic): a name outside it can never exist on
    # a broker, so a rule naming it is certainly a typo.
    if re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name) is None or name in (".", ".."):
        raise ValueError("not a Kafka topic name")
    return name


def _repeats(values: tuple[object, ...]) -> list[tuple[int, int, object]]:
    """(index, index of its first listing, value) of each value listed before, in order."""
    first: dict[object, int] = {}
    return [(i, first[v], v) for i, v in enumerate(values) if first.setdefault(v, i) != i]


def _partitions_listed_once(partitions: tuple[int, ...]) -> tuple[int, ...]:
    if not partitions:
        # "every partition" is said by leaving the key out, never by an empty list.
        raise PydanticCustomError("partitions_empty", "at least one partition is needed")
    if repeats := _repeats(partitions):
        context = {"repeats": repeats}
        raise PydanticCustomError("partition_repeated", "partitions listed twice", context)
    return partitions


def _topics_listed_once(outputs: tuple[TransactionOutput, ...]) -> tuple[TransactionOutput, ...]:
    if repeats := _repeats(tuple(output.topic for output in outputs)):
        raise PydanticCustomError("topic_repeated", "topics listed twice", {"repeats": repeats})
    return outputs


# Value types of the rule file. A ``description`` is the "expected ..." of error messages
# where the type and its bounds alone would not say it.
NonEmptyText = Annotated[StrictStr, MinLen(1)]
Glob = Annotated[
    NonEmptyText, Field(description="a glob pattern (a non-empty string such as 'orders.*')")
]
TopicName = Annotated[
    StrictStr,
    AfterValidator(_kafka_topic_name),
    Field(description="a Kafka topic name (1 to 249 of the characters a-z A-Z 0-9 . _ -)"),
]
ByteSize = Annotated[StrictInt, Interval(ge=1024, le=INT32_MAX)]
Partitions = Annotated[
    tuple[Annotated[StrictInt, Interval(ge=0, le=INT32_MAX)], ...],
    AfterValidator(_partitions_listed_once),
    Field(description="a list of partition numbers"),
]
ApiKeyRef = Annotated[
    Annotated[StrictInt, Interval(ge=0, le=API_KEY_MAX)] | NonEmptyText,
    Field(
        description=f"an API key number between 0 and {API_KEY_MAX} "
        "or an API name such as 'Produce'"
    ),
]

# Unknown keys are errors: a misspelt key would otherwise silently mean its default.
_closed = with_config(ConfigDict(extra="forbid"))


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The ``limits`` section: what one client, or all of them, may make kipside hold.

    docs/rules.md says what reaching each one does; the proxy reads them per event, so a
    reload applies at once (except ``max_frame_bytes``: connections opened after it).
    """

    max_frame_bytes: ByteSize = DEFAULT_MAX_FRAME_BYTES
    max_connections: Annotated[StrictInt, Ge(1)] = 10_000
    # Requests read and not yet answered, plus answers not yet taken by the client's socket.
    max_in_flight_bytes: ByteSize = 256 * 1024 * 1024
    max_in_flight_bytes_per_client: ByteSize = 16 * 1024 * 1024
    # Caps on what kipside itself decodes (ProduceRequests it coalesces, request headers).
    max_partitions_per_request: Annotated[StrictInt, Interval(ge=1, le=INT32_MAX)] = 100_000
    max_tagged_fields: Annotated[StrictInt, Interval(ge=0, le=INT32_MAX)] = 64
    max_tagged_field_bytes: Annotated[StrictInt, Interval(ge=0, le=INT32_MAX)] = 1024 * 1024
    # 0 turns a timeout off. Apache Kafka's connections.max.idle.ms is 600000 too.
    idle_timeout_ms: Annotated[StrictInt, Interval(ge=0, le=INT32_MAX)] = 600_000
    request_read_timeout_ms: Annotated[StrictInt, Interval(ge=0, le=INT32_MAX)] = 60_000
    _decode_limits: DecodeLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen dataclasses forbid normal assignment; this is a derived cache only, made once
        # per rule set rather than per request.
        decode = DecodeLimits(
            max_tagged_fields=self.max_tagged_fields,
            max_tagged_field_bytes=self.max_tagged_field_bytes,
            max_partitions=self.max_partitions_per_request,
        )
        object.__setattr__(self, "_decode_limits", decode)

    @property
    def decode_limits(self) -> DecodeLimits:
        """The caps kipside's own readers apply to a client's request (kipside.protocol)."""
        return self._decode_limits


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescingRule:
    """One ``coalescing.rules`` entry: whether produce traffic matching both globs coalesces."""

    topic: Glob = "*"
    client_id: Glob = "*"
    coalesce: StrictBool
    _topic_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _client_id_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen dataclasses forbid normal assignment; these are derived caches only.
        object.__setattr__(self, "_topic_re", _compile_glob(self.topic))
        object.__setattr__(self, "_client_id_re", _compile_glob(self.client_id))

    def matches(self, topic: str, client_id: str | None) -> bool:
        # A client without a client id is matched as "", which only '*' matches.
        return (
            self._topic_re.match(topic) is not None
            and self._client_id_re.match(client_id or "") is not None
        )


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescingRules:
    """The ``coalescing`` section: how produce requests are merged into multi-batch requests."""

    enabled: StrictBool = True
    lanes: Annotated[StrictInt, Interval(ge=1, le=64)] = 2
    linger_ms: Annotated[StrictFloat, AllowInfNan(False), Ge(0)] = 0.0
    max_request_bytes: ByteSize = 1024 * 1024
    rules: Annotated[
        tuple[CoalescingRule, ...],
        Field(description="a list of rules ({topic, client_id, coalesce})"),
    ] = ()

    def applies(self, topic: str, client_id: str | None) -> bool:
        """Whether produce traffic for ``topic`` from ``client_id`` may be coalesced.

        The first rule whose ``topic`` and ``client_id`` globs both match decides; when no
        rule matches, ``enabled`` decides. ``client_id`` is None for a client without one.
        """
        for rule in self.rules:
            if rule.matches(topic, client_id):
                return rule.coalesce
        return self.enabled


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionOutput:
    """A topic a transaction writes to; ``partitions`` is None for "every partition"."""

    topic: TopicName
    partitions: Partitions | None = field(default=None, metadata={"absent": "every partition"})


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class HoldBegin:
    """How long the proxy may hold a transaction's first request while it pre-registers."""

    max_ms: Annotated[StrictInt, Interval(ge=1, le=300_000)] = 5_000


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionRule:
    """One ``transactions`` entry: what producers whose transactional id matches will touch."""

    transactional_id: Glob
    outputs: Annotated[
        tuple[TransactionOutput, ...],
        AfterValidator(_topics_listed_once),
        Field(description="a list of outputs ({topic, partitions}), or []"),
    ]
    consumer_group: NonEmptyText | None = None
    hold_begin: HoldBegin = field(default_factory=HoldBegin)
    _transactional_id_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_transactional_id_re", _compile_glob(self.transactional_id))

    def matches(self, transactional_id: str) -> bool:
        return self._transactional_id_re.match(transactional_id) is not None


Globs = Annotated[
    tuple[Glob, ...], Field(description="a list of glob patterns (such as 'orders.*')")
]


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class PrincipalRule:
    """One ``principals`` entry: what a principal may use through kipside (never more than the
    broker allows it; the broker still authorizes everything it is sent)."""

    principal: Annotated[
        NonEmptyText, Field(description="a principal glob such as 'User:alice' or 'User:app-*'")
    ]
    topics: Globs | None = field(default=None, metadata={"absent": "every topic"})
    transactional_ids: Globs | None = field(
        default=None, metadata={"absent": "every transactional id"}
    )
    _principal_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _topic_res: tuple[re.Pattern[str], ...] | None = field(init=False, repr=False, compare=False)
    _transactional_id_res: tuple[re.Pattern[str], ...] | None = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_principal_re", _compile_glob(self.principal))
        for name, globs in (
            ("_topic_res", self.topics),
            ("_transactional_id_res", self.transactional_ids),
        ):
            compiled = None if globs is None else tuple(_compile_glob(g) for g in globs)
            object.__setattr__(self, name, compiled)

    def matches(self, principal: str) -> bool:
        return self._principal_re.match(principal) is not None

    def allows_topic(self, topic: str) -> bool:
        patterns = self._topic_res
        return patterns is None or any(p.match(topic) for p in patterns)

    def allows_transactional_id(self, transactional_id: str) -> bool:
        patterns = self._transactional_id_res
        return patterns is None or any(p.match(transactional_id) for p in patterns)


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class Tracing:
    """The ``tracing`` section: whether, and for which Kafka APIs, kipside makes OpenTelemetry
    spans once an exporter is configured (--otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or
    --trace-console); ``enabled: false`` turns spans off even then."""

    enabled: StrictBool = True
    # API keys by number (0..32767) or by Kafka API name, e.g. "Produce".
    api_keys: Annotated[
        tuple[ApiKeyRef, ...], Field(description="a list of API keys (numbers or names)")
    ] = DEFAULT_TRACED_API_KEYS


FilePath = Annotated[
    NonEmptyText,
    Field(description="a file path (relative paths start from the rule file's folder)"),
]
ColumnNames = Annotated[
    tuple[NonEmptyText, ...],
    MinLen(1),
    Field(description="a list of the schema's top-level field names (or kafka_key, kafka_headers)"),
]
ParquetCodec = Annotated[
    Literal["zstd", "snappy", "gzip", "lz4", "none"],
    Field(description="one of zstd, snappy, gzip, lz4, none"),
]
Encoding = Annotated[Literal["parquet"], Field(description="parquet (the one encoding there is)")]


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnarEncryption:
    """A columnar rule's ``encrypt``: which columns Parquet modular encryption covers, and the
    key file whose ``write_key`` encrypts them."""

    columns: ColumnNames
    key_file: FilePath


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnarRule:
    """A topic rule's ``columnar``: the topic's batches travel as Parquet segments
    (docs/columnar.md). The loader reads the schema file and the key file it names; `schema`
    and `key_file` stay as written (relative to the rule file's folder)."""

    encoding: Encoding = "parquet"
    schema: FilePath
    compression: ParquetCodec = "zstd"
    lossless: StrictBool = False
    encrypt: ColumnarEncryption | None = field(default=None, metadata={"absent": "no encryption"})
    _value_schema: ValueSchema | None = field(init=False, repr=False, compare=False)
    _keys: ColumnarKeys | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Filled in by the loader, once it has read the files (a model built in code has none).
        object.__setattr__(self, "_value_schema", None)
        object.__setattr__(self, "_keys", None)

    @property
    def value_schema(self) -> ValueSchema:
        """The schema file, as the loader read it."""
        if self._value_schema is None:
            raise LookupError("this ColumnarRule was not made by the rule loader: no schema read")
        return self._value_schema

    @property
    def keys(self) -> ColumnarKeys | None:
        """The key file, as the loader read it (None without ``encrypt``)."""
        return self._keys

    def options(self) -> ColumnarOptions:
        """The codec's options for this rule."""
        return ColumnarOptions(
            compression=self.compression,
            lossless=self.lossless,
            encrypt=self.encrypt.columns if self.encrypt else (),
            keys=self._keys,
        )

    def arrow_schema(self) -> pa.Schema:
        """The values' Arrow schema (imports pyarrow)."""
        return self.value_schema.to_arrow()


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class TopicRule:
    """One ``topics`` entry: what kipside does with the data of topics whose name matches."""

    topic: Glob
    columnar: ColumnarRule | None = field(default=None, metadata={"absent": "ordinary batches"})
    _topic_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_topic_re", _compile_glob(self.topic))

    def matches(self, topic: str) -> bool:
        return self._topic_re.match(topic) is not None


@_closed
@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSet:
    """A whole rule file. ``RuleSet()`` is the built-in defaults (an empty file)."""

    source: str = DEFAULT_SOURCE
    version: str = DEFAULT_VERSION
    limits: Limits = field(default_factory=Limits)
    coalescing: CoalescingRules = field(default_factory=CoalescingRules)
    transactions: Annotated[
        tuple[TransactionRule, ...],
        Field(description="a list of transaction rules ({transactional_id, outputs, ...})"),
    ] = ()
    tracing: Tracing = field(default_factory=Tracing)
    principals: Annotated[
        tuple[PrincipalRule, ...],
        Field(description="a list of principal rules ({principal, topics, transactional_ids})"),
    ] = ()
    topics: Annotated[
        tuple[TopicRule, ...], Field(description="a list of topic rules ({topic, columnar})")
    ] = ()

    def topic_rule_for(self, topic: str) -> TopicRule | None:
        """The first ``topics`` entry whose glob matches, or None."""
        for rule in self.topics:
            if rule.matches(topic):
                return rule
        return None

    def columnar_for(self, topic: str) -> ColumnarRule | None:
        """The columnar rule of the first ``topics`` entry matching ``topic``, or None."""
        rule = self.topic_rule_for(topic)
        return None if rule is None else rule.columnar

    def principal_rule_for(self, principal: str) -> PrincipalRule | None:
        """The first ``principals`` entry whose glob matches, or None (no restriction)."""
        for rule in self.principals:
            if rule.matches(principal):
                return rule
        return None

    def transaction_rule_for(self, transactional_id: str) -> TransactionRule | None:
        """The first ``transactions`` entry whose glob matches, or None."""
        for rule in self.transactions:
            if rule.matches(transactional_id):
                return rule
        return None

    def describe(self) -> dict[str, Any]:
        """The effective configuration, defaults filled in, as plain dicts/lists/scalars.

        Apart from ``source`` and ``version`` (which describe the file, not its contents)
        the result is itself a valid rule file: dumping it with ``yaml.safe_dump`` and
        parsing it again gives an equal ``RuleSet``.
        """
        described: dict[str, Any] = _plain(self)
        return described


def _plain(value: Any) -> Any:
    """A model value as plain dicts, lists and scalars: a dataclass as its fields in
    declaration order (derived caches left out, and an optional field that is None too:
    absent rather than null, so the output is itself a valid rule file), a tuple as a list."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if not is_dataclass(value):
        return value
    plain = {f.name: _plain(getattr(value, f.name)) for f in fields(value) if f.init}
    return {key: item for key, item in plain.items() if item is not None}
