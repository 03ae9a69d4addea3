"""One transaction of one transactional id, run the way Kafka's transactional producer runs it.

`Transaction(...)` asks the transaction coordinator for the id's producer session
(InitProducerId): the coordinator bumps the epoch, which fences any older writer of the same id
and aborts whatever transaction it left open. Batches then go through the producing half
(pipeline.kafka.producer, with the transactional bit and the id), each partition registered
with AddPartitionsToTxn before its first batch; `send_offsets` adds a consumer group's offsets
to the transaction (AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the
group coordinator); `commit` ends it (EndTxn). Kafka's rules kept: one producer id and epoch per
request, AddPartitionsToTxn v0-3 (v4+ is for brokers), partitions added before they are
written, retriable answers (CONCURRENT_TRANSACTIONS while a previous transaction completes, a
moved coordinator) retried with the client's backoff.

What it must never do: commit what was not acknowledged, or go on after being fenced
(FencedError, which nothing retries).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Generic, TypeVar

from kipside.protocol import ApiKey, RecordBatchView, VersionRange, error_name

from .client import DedicatedConnection, KafkaClient, body_of, check_error
from .errors import FencedError
from .producer import FENCED, IdempotentProducer, ProduceConfig, Written

__all__ = ["Transaction"]

Tag = TypeVar("Tag")
TopicPartition = tuple[str, int]
ADD_PARTITIONS: Final = VersionRange(0, 3)
ADD_OFFSETS: Final = VersionRange(0, 3)
TXN_OFFSET_COMMIT: Final = VersionRange(0, 3)
END_TXN: Final = VersionRange(0, 3)
_TRANSACTION_KEY: Final = 1
_GROUP_KEY: Final = 0
_OPERATION_NOT_ATTEMPTED: Final = 55


class Transaction(Generic[Tag]):
    """One transaction; a new one fences every older writer of `transactional_id`."""

    def __init__(
        self,
        client: KafkaClient,
        transactional_id: str,
        config: ProduceConfig | None = None,
        *,
        timeout_ms: int = 60_000,
        connections: dict[int, DedicatedConnection] | None = None,
    ) -> None:
        self.client = client
        self.transactional_id = transactional_id
        self._registered: set[TopicPartition] = set()
        self._offsets = False
        self.producer: IdempotentProducer[Tag] = IdempotentProducer(
            client,
            config,
            transactional_id=transactional_id,
            transaction_timeout_ms=timeout_ms,
            register=self._register,
            connections=connections,
        )
        self.producer.new_session()

    @property
    def empty(self) -> bool:
        """Nothing was added: there is no transaction to end."""
        return not self._registered and not self._offsets

    def add(self, topic: str, partition: int, batch: RecordBatchView, tag: Tag) -> None:
        self.producer.add(topic, partition, batch, tag)

    def flush(self, on_written: Callable[[list[Written[Tag]]], None]) -> None:
        self.producer.flush(on_written)

    # The transaction coordinator -----------------------------------------------------------

    def _fields(self) -> dict[str, object]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer.producer_id,
            "producer_epoch": self.producer.producer_epoch,
        }

    def _check(self, code: int, what: str) -> None:
        if code in FENCED:
            raise FencedError(
                f"{what} for transactional id {self.transactional_id!r} was answered "
                f"{error_name(code)} by {self.client.where}: a newer writer of the same id took "
                "over (a restarted or retried copy of this task)",
                code=code,
            )
        check_error(
            code, f"{what} for transactional id {self.transactional_id!r}", self.client.where
        )

    def _register(self, partitions: list[TopicPartition]) -> None:
        """AddPartitionsToTxn for the partitions not yet in this transaction."""
        new = sorted(set(partitions) - self._registered)
        if not new:
            return
        topics: dict[str, list[int]] = {}
        for topic, partition in new:
            topics.setdefault(topic, []).append(partition)
        fields = {
            "v3_and_below_transactional_id": self.transactional_id,
            "v3_and_below_producer_id": self.producer.producer_id,
            "v3_and_below_producer_epoch": self.producer.producer_epoch,
            "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        }
        body = body_of(ApiKey.ADD_PARTITIONS_TO_TXN, fields)

        def attempt() -> None:
            node = self.client.coordinator(self.transactional_id, _TRANSACTION_KEY)
            response = self.client.request(
                node, ApiKey.ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS, body
            ).decode()
            codes = [
                int(p.partition_error_code)
                for t in response.results_by_topic_v3_and_below
                for p in t.results_by_partition
            ]
            # One partition's error makes the others OPERATION_NOT_ATTEMPTED: report that one.
            real = [c for c in codes if c not in (0, _OPERATION_NOT_ATTEMPTED)]
            self._check(real[0] if real else 0, "AddPartitionsToTxn")

        self.client.retrying("adding partitions to the transaction", attempt)
        self._registered.update(new)

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit `offsets` (next offset to read) for `group` as part of this transaction."""
        add = body_of(ApiKey.ADD_OFFSETS_TO_TXN, {**self._fields(), "group_id": group})

        def add_group() -> None:
            node = self.client.coordinator(self.transactional_id, _TRANSACTION_KEY)
            response = self.client.request(node, ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS, add)
            self._check(int(response.decode().error_code), "AddOffsetsToTxn")

        self.client.retrying("adding a group's offsets to the transaction", add_group)
        self._offsets = True
        topics: dict[str, list[dict[str, object]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            )
        fields = {
            **self._fields(),
            "group_id": group,
            "generation_id": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        }
        commit = body_of(ApiKey.TXN_OFFSET_COMMIT, fields)

        def commit_offsets() -> None:
            node = self.client.coordinator(group, _GROUP_KEY)
            response = self.client.request(
                node, ApiKey.TXN_OFFSET_COMMIT, TXN_OFFSET_COMMIT, commit
            ).decode()
            for topic in response.topics:
                for p in topic.partitions:
                    self._check(
                        int(p.error_code),
                        f"TxnOffsetCommit of group {group!r} on {topic.name}-{p.partition_index}",
                    )

        self.client.retrying("committing offsets in the transaction", commit_offsets)

    def commit(self) -> None:
        """End the transaction, committing it (everything must have been flushed)."""
        self._end(committed=True)

    def abort(self) -> None:
        self._end(committed=False)

    def _end(self, *, committed: bool) -> None:
        if self.empty:
            return
        body = body_of(ApiKey.END_TXN, {**self._fields(), "committed": committed})

        def attempt() -> None:
            node = self.client.coordinator(self.transactional_id, _TRANSACTION_KEY)
            response = self.client.request(node, ApiKey.END_TXN, END_TXN, body).decode()
            self._check(int(response.error_code), "EndTxn")

        self.client.retrying("ending the transaction", attempt)
        self._registered.clear()
        self._offsets = False

    def release(self) -> None:
        self.producer.release()
