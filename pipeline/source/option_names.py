"""The names of the `kipside` source's options: which exist, which are refused, how each is spelled.

The options are Spark's Kafka source's, the `kafka.`-prefixed client configs the reader honours
(TLS and SASL among them),
and kipside's own; a few of Spark's are refused with what to use instead. Spark hands a Python
data source its options lower-cased, so CANONICAL gives the spelling messages use.
pipeline.source.options reads and checks the values.
"""

from __future__ import annotations

from typing import Final

from kipside.pipeline.kafka.security import SECURITY_CONFIGS

__all__ = ["CANONICAL", "KAFKA_IGNORED", "KAFKA_INT", "KNOWN", "UNSUPPORTED"]

# Options of Spark's Kafka source that kipside does not take, and why (see docs/lake.md).
UNSUPPORTED: Final[dict[str, str]] = {
    "maxrecordsperpartition": "use minPartitions to split big partitions",
    "minoffsetspertrigger": "not implemented; micro-batches start as soon as data arrives",
    "maxtriggerdelay": "not implemented (it only applies with minOffsetsPerTrigger)",
    "groupidprefix": "kipside's reader joins no consumer group",
    "kafkaconsumer.polltimeoutms": "use kafka.request.timeout.ms",
    "fetchoffset.numretries": "use kafka.default.api.timeout.ms (retries run until it)",
    "fetchoffset.retryintervalms": "use kafka.retry.backoff.ms",
    "kafka.auto.offset.reset": "set startingOffsets to earliest or latest instead",
    "kafka.key.deserializer": "keys are bytes; decode them with DataFrame operations",
    "kafka.value.deserializer": "values are bytes; decode them with DataFrame operations",
    "kafka.enable.auto.commit": "the query's checkpoint keeps its offsets",
    "kafka.interceptor.classes": "there are no JVM interceptors here",
}

# Kafka client configs the reader honours, passed as kafka.<name> like Spark's source.
KAFKA_INT: Final = {
    "kafka.request.timeout.ms",
    "kafka.default.api.timeout.ms",
    "kafka.retry.backoff.ms",
    "kafka.retry.backoff.max.ms",
    "kafka.socket.connection.setup.timeout.ms",
    "kafka.max.partition.fetch.bytes",
    "kafka.fetch.max.bytes",
    "kafka.fetch.max.wait.ms",
    "kafka.transaction.marker.timeout.ms",
    "kafka.receive.message.max.bytes",
}
# Accepted and ignored, as Spark's source ignores them for reading (documented).
KAFKA_IGNORED: Final = {"kafka.group.id", "kafka.session.timeout.ms", "kafka.client.rack"}

KNOWN: Final = (
    {
        "kafka.bootstrap.servers",
        "kafka.client.id",
        "kafka.isolation.level",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "startingoffsetsbytimestamp",
        "endingoffsetsbytimestamp",
        "startingtimestamp",
        "endingtimestamp",
        "startingoffsetsbytimestampstrategy",
        "maxoffsetspertrigger",
        "maxbytespertrigger",
        "minpartitions",
        "failondataloss",
        "includeheaders",
        "rows",
        "valueschema",
        "columnarkeyfile",
        "path",
        "kipside.stopmarker",
        "kipside.noticefile",
        "kipside.role",
        "kipside.settingshint",
    }
    | KAFKA_INT
    | KAFKA_IGNORED
    | {f"kafka.{name}" for name in SECURITY_CONFIGS}
)

# Spark hands options to a Python data source lower-cased, so messages name them the way
# Spark's documentation (and docs/lake.md) spells them.
CANONICAL: Final = {
    name.lower(): name
    for name in (
        "subscribePattern",
        "startingOffsets",
        "endingOffsets",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxOffsetsPerTrigger",
        "maxBytesPerTrigger",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "maxRecordsPerPartition",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "groupIdPrefix",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "kipside.stopMarker",
        "kipside.noticeFile",
        "kipside.role",
        "kipside.settingsHint",
        "valueSchema",
        "columnarKeyFile",
    )
}
