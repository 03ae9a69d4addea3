"""What can go wrong talking to Kafka from the pipeline, in words a user can act on.

Every error names the cluster (source or destination), what was being done, Kafka's own error
name where the broker gave one, and what to do. `RetriableError` is the only kind the client
retries by itself; everything else reaches the job and fails it clearly.
"""

from __future__ import annotations

from kipside.protocol import error_name

__all__ = [
    "BatchTooLarge",
    "BrokerError",
    "ClusterUnreachable",
    "CorruptBatchError",
    "DataLossError",
    "FencedError",
    "KafkaError",
    "RetriableError",
    "SecurityError",
    "TopicNotFound",
]


class KafkaError(Exception):
    """A Kafka operation of the pipeline failed; the message says what, where and what to do."""


class RetriableError(KafkaError):
    """Worth another try after a metadata refresh and a backoff (librdkafka's retriable set)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class BrokerError(KafkaError):
    """The broker answered with an error that retrying won't fix."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code
        self.name = error_name(code)


class ClusterUnreachable(KafkaError):
    """No broker of a cluster answered before the deadline."""


class TopicNotFound(KafkaError):
    """A topic the job was told to use does not exist."""


class DataLossError(KafkaError):
    """Offsets the job must read are gone (retention, deletion) and failOnDataLoss is on."""


class CorruptBatchError(KafkaError):
    """A record batch read from the broker fails its CRC or can't be parsed."""


class BatchTooLarge(KafkaError):
    """A record batch decompresses to more than receive.message.max.bytes."""


class SecurityError(KafkaError):
    """TLS or SASL refused the client: a certificate not trusted, a wrong password, a mechanism
    the broker does not offer. Retrying won't help; the settings must change."""


class FencedError(BrokerError):
    """A transactional writer was fenced: a newer one with the same transactional id took over
    (its transaction was aborted). The newer writer carries on; this one must stop."""
