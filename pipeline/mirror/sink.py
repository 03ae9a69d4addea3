"""The mirror's Spark sink: `writeStream.format("kipside-mirror")` over `rows=batches` rows.

Options (strings, as Spark passes them): kafka.bootstrap.servers (the destination),
source.kafka.bootstrap.servers (the source, for topic configs and its cluster id), rename
(a prefix for destination topic names), offsetSyncTopic ("" turns syncs off), bufferBytes,
the producer's kafka.request.timeout.ms, kafka.delivery.timeout.ms, kafka.max.request.size,
kafka.client.id, and each cluster's TLS and SASL settings: kafka.security.protocol,
kafka.sasl.*, kafka.ssl.* for the destination, the same under source.kafka. for the source.
Each write task copies its rows through the worker's MirrorSession and returns what it wrote,
which the driver's commit logs. At-least-once: a retried task copies its batches
again (docs/mirror.md says exactly when); with exactlyOnce=true (and transactionalIdPrefix),
exactly once (pipeline.mirror.exactly_once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from kipside.pipeline.kafka.client import ClientConfig
from kipside.pipeline.kafka.producer import ProduceConfig
from kipside.pipeline.kafka.security import (
    SECURITY_CONFIGS,
    Security,
    SecurityConfigError,
    parse_security,
)
from kipside.pipeline.source.batch_rows import BATCH_STRUCT
from kipside.pipeline.source.options import OptionError
from kipside.protocol import Address

from .exactly_once import ExactlyOnceSession
from .offset_sync import DEFAULT_TOPIC
from .session import MirrorSession, SinkOptions

__all__ = ["MirrorCommit", "MirrorSink", "parse_sink_options"]

log = logging.getLogger("kipside.mirror")


@dataclass
class MirrorCommit(WriterCommitMessage):
    batches: int = 0
    records: int = 0
    bytes: int = 0
    syncs: int = 0
    partitions: dict[str, int] = field(default_factory=dict)
    skipped: int = 0


def _addresses(options: Mapping[str, str], key: str) -> tuple[Address, ...]:
    text = options.get(key)
    if not text or not text.strip():
        raise OptionError(f"option {key} must be set for the kipside-mirror sink")
    try:
        return Address.parse_list(text, what=f"option {key}")
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _int(options: Mapping[str, str], key: str, default: int) -> int:
    text = options.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {key}: {text!r} is not a whole number") from None
    if value <= 0:
        raise OptionError(f"option {key}: {value} must be positive")
    return value


def _security(options: Mapping[str, str], prefix: str) -> Security:
    given = {
        key.removeprefix(prefix): value
        for key, value in options.items()
        if key.startswith(prefix) and key.removeprefix(prefix) in SECURITY_CONFIGS
    }
    try:
        return parse_security(given, lambda key: f"option {prefix}{key}")
    except SecurityConfigError as exc:
        raise OptionError(str(exc)) from None


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    options = {k.lower(): str(v) for k, v in raw.items()}
    sync_topic = options.get("offsetsynctopic", DEFAULT_TOPIC)
    defaults = ProduceConfig()
    produce = ProduceConfig(
        max_request_size=_int(options, "kafka.max.request.size", defaults.max_request_size),
        request_timeout_ms=_int(options, "kafka.request.timeout.ms", defaults.request_timeout_ms),
        delivery_timeout_ms=_int(
            options, "kafka.delivery.timeout.ms", defaults.delivery_timeout_ms
        ),
    )
    return SinkOptions(
        dest=_addresses(options, "kafka.bootstrap.servers"),
        source=_addresses(options, "source.kafka.bootstrap.servers"),
        rename=options.get("rename", ""),
        sync_topic=sync_topic or None,
        buffer_bytes=_int(options, "bufferbytes", 64 * 1024 * 1024),
        exactly_once=options.get("exactlyonce", "false").strip().lower() == "true",
        transactional_prefix=options.get("transactionalidprefix", "kipside-mirror"),
        client=ClientConfig(
            client_id=options.get("kafka.client.id", "kipside-mirror"),
            security=_security(options, "kafka."),
            settings_hint=options.get("kipside.settingshint", "option kafka.sasl.jaas.config"),
        ),
        source_client=ClientConfig(
            client_id=options.get("source.kafka.client.id", "kipside-mirror"),
            security=_security(options, "source.kafka."),
            settings_hint=options.get(
                "source.kipside.settingshint", "option source.kafka.sasl.jaas.config"
            ),
        ),
        produce=produce,
    )


_sessions: dict[SinkOptions, MirrorSession] = {}


def session_for(options: SinkOptions) -> MirrorSession:
    """This worker's session for the query (kept between its tasks)."""
    session = _sessions.get(options)
    if session is None:
        kind = ExactlyOnceSession if options.exactly_once else MirrorSession
        session = _sessions[options] = kind(options)
    return session


def discard_session(options: SinkOptions) -> None:
    """After a failure: close the clients and forget the producer session."""
    session = _sessions.pop(options, None)
    if session is not None:
        session.close()


class MirrorSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kipside-mirror"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        expected = BATCH_STRUCT
        if [f.name for f in schema.fields] != [f.name for f in expected.fields]:
            raise OptionError(
                'the kipside-mirror sink takes the rows of format("kipside") with '
                f'option("rows", "batches"): {expected.simpleString()}, got '
                f"{schema.simpleString()}"
            )
        return MirrorWriter(parse_sink_options(dict(self.options)))


class MirrorWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        session = session_for(self.options)
        try:
            stats = session.copy(iterator)
        except BaseException:
            discard_session(self.options)
            raise
        return MirrorCommit(
            stats.batches, stats.records, stats.bytes, stats.syncs, stats.partitions, stats.skipped
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, MirrorCommit)]
        log.info(
            "micro-batch %d: %d batches, %d records, %d bytes copied",
            batchId,
            sum(m.batches for m in done),
            sum(m.records for m in done),
            sum(m.bytes for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "micro-batch %d failed; it will be copied again when the query restarts", batchId
        )
