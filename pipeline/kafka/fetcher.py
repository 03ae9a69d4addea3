"""Read one partition's offset range [start, end) as whole record batches, in log order.

This is the one reader both pipelines use: the shallow mirror keeps the batches as they are, the
lake decodes their records. It fetches from the partition's leader (following it when it moves),
checks every batch's CRC, and applies read_committed through protocol.read_committed: when a
transactional batch inside the range waits for a marker that lies past `end`, it keeps reading
past `end`, looking only at markers, until every batch in the range is decided.

What a range holds: every batch that overlaps [start, end) is yielded, so the caller decides
what owns a batch cut by a range boundary (see pipeline.source.ranges). Offsets that are gone
(retention, truncation) raise DataLossError unless the caller chose to skip them, which is
reported through `on_data_loss`. It never decompresses and never holds more than the range.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from kipside.protocol import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ApiKey,
    ErrorCode,
    FetchPartition,
    PartitionData,
    ReadCommittedFilter,
    RecordBatchError,
    RecordBatchView,
    Verdict,
    encode_fetch_request,
    iter_batches,
    parse_fetch_response,
)

from .client import KafkaClient, check_error
from .errors import CorruptBatchError, DataLossError, KafkaError
from .offsets import EARLIEST, FETCH, list_offsets, watermarks

__all__ = ["FetchConfig", "RangeReader"]

_OUT_OF_RANGE: Final = int(ErrorCode.offset_out_of_range)


@dataclass(frozen=True, slots=True)
class FetchConfig:
    """Fetch settings, named after the Kafka consumer configs they stand for."""

    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    """max.partition.fetch.bytes"""
    fetch_max_bytes: int = 64 * 1024 * 1024
    """fetch.max.bytes"""
    fetch_max_wait_ms: int = 500
    """fetch.max.wait.ms: how long the broker may wait for data that is not there yet."""
    committed_only: bool = True
    """isolation.level=read_committed"""
    fail_on_data_loss: bool = True
    """Spark's failOnDataLoss"""
    marker_timeout_ms: int = 60_000
    """How long to wait for a transaction marker the broker's last stable offset promised."""
    receive_message_max_bytes: int = 100_000_000
    """receive.message.max.bytes (librdkafka's name and default): the most one batch's records
    may decompress to, for readers that decompress (rows=records)."""


class RangeReader:
    """Reads ranges of partitions of one cluster through one KafkaClient."""

    def __init__(
        self,
        client: KafkaClient,
        config: FetchConfig,
        *,
        on_data_loss: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self._on_data_loss = on_data_loss

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[RecordBatchView]:
        """The readable data batches overlapping [start, end), in log order."""
        where = f"{topic}-{partition}"
        verdicts = ReadCommittedFilter(committed_only=self.config.committed_only)
        offset = start
        stalled_since: float | None = None
        while offset < end or verdicts.undecided:
            looking_ahead = offset >= end
            data = self._fetch(topic, partition, offset, committed=not looking_ahead)
            if data is None:  # offsets lost and skipped
                offset = self._skip_lost(topic, partition, offset, end)
                continue
            if not looking_ahead and data.aborted_transactions:
                verdicts.add_aborted(data.aborted_transactions)
            progressed = False
            for batch in self._batches(data, where, offset):
                last = batch.base_offset + batch.last_offset_delta
                if batch.base_offset >= end:
                    verdicts.feed_marker(batch)
                else:
                    verdicts.feed(batch)
                offset = last + 1
                progressed = True
            for decided in verdicts.take():
                if decided.verdict is Verdict.DATA:
                    yield decided.batch
            if progressed:
                stalled_since = None
                continue
            stalled_since = stalled_since or time.monotonic()
            offset = self._no_progress(data, where, offset, end, verdicts, stalled_since)

    # One fetch ------------------------------------------------------------------------------

    def _fetch(
        self, topic: str, partition: int, offset: int, *, committed: bool
    ) -> PartitionData | None:
        """One partition's answer at `offset`; None if the offset is out of range and lost."""
        isolation = READ_COMMITTED if committed and self.config.committed_only else READ_UNCOMMITTED
        cfg = self.config
        request = [FetchPartition(topic, partition, offset, cfg.max_partition_fetch_bytes)]

        def attempt() -> PartitionData | None:
            leader = self.client.leader(topic, partition)

            def body(version: int) -> bytes:
                return encode_fetch_request(
                    version,
                    request,
                    max_wait_ms=cfg.fetch_max_wait_ms,
                    min_bytes=1,
                    max_bytes=cfg.fetch_max_bytes,
                    isolation_level=isolation,
                )

            response = self.client.request(leader, ApiKey.FETCH, FETCH, body)
            data = parse_fetch_response(response.frame, response.body_offset, response.api_version)
            check_error(data.error_code, "Fetch", self.client.where)
            for p in data.partitions:
                if (p.topic, p.partition) != (topic, partition):
                    continue
                if p.error_code == _OUT_OF_RANGE:
                    return None
                check_error(
                    p.error_code,
                    f"Fetch of {topic}-{partition} at offset {offset}",
                    self.client.where,
                )
                return p
            raise KafkaError(
                f"Fetch of {topic}-{partition}: {self.client.where} answered without that partition"
            )

        return self.client.retrying(f"fetching {topic}-{partition} at offset {offset}", attempt)

    def _batches(self, data: PartitionData, where: str, offset: int) -> Iterator[RecordBatchView]:
        """The complete batches of one answer that reach `offset` or beyond, CRC-checked."""
        try:
            for batch in iter_batches(data.records, allow_partial_tail=True):
                if batch.base_offset + batch.last_offset_delta < offset:
                    continue  # the broker starts at the batch holding `offset`
                if not batch.crc_valid():
                    raise CorruptBatchError(
                        f"{where}: the record batch at offset {batch.base_offset} from "
                        f"{self.client.where} fails its CRC-32C check (stored 0x{batch.crc:08x}, "
                        f"computed 0x{batch.compute_crc():08x}). The log or the network "
                        "corrupted it; nothing was copied past offset "
                        f"{batch.base_offset - 1}. Check the broker's log for this partition"
                    )
                yield batch
        except RecordBatchError as exc:
            raise CorruptBatchError(
                f"{where}: unreadable record batch in the Fetch answer from {self.client.where}"
                f" at offset {offset}: {exc}"
            ) from exc

    # When a fetch brings nothing ----------------------------------------------------------

    def _no_progress(
        self,
        data: PartitionData,
        where: str,
        offset: int,
        end: int,
        verdicts: ReadCommittedFilter,
        stalled_since: float,
    ) -> int:
        """Where to fetch next after an answer with no whole batch at or past `offset`."""
        if data.records and len(data.records) >= self.config.max_partition_fetch_bytes:
            raise KafkaError(
                f"{where}: the batch at offset {offset} is larger than "
                f"max.partition.fetch.bytes ({self.config.max_partition_fetch_bytes}); raise it"
            )
        if offset < end and data.high_watermark >= 0 and offset >= data.high_watermark:
            # The range was planned below the high watermark: the log was truncated.
            return self._lost(where, offset, end, f"the log now ends at {data.high_watermark}")
        # Below `end`: read_committed stopped at the last stable offset. Past it: a marker the
        # range needs is not written yet. Either way the broker must move on, within a bound.
        waited = time.monotonic() - stalled_since
        if waited > self.config.marker_timeout_ms / 1000:
            waiting = ", ".join(
                f"producer id {pid} from offset {first}"
                for pid, first in sorted(verdicts.waiting_for.items())
            )
            raise KafkaError(
                f"{where}: waited {waited:.0f} s at offset {offset} for transactions to end "
                f"({waiting or 'an open transaction below the range end ' + str(end)}); the "
                f"log ends at {data.high_watermark}, its last stable offset is "
                f"{data.last_stable_offset}. The range was planned past the last stable offset "
                "or a transaction is stuck open; read with isolation read_uncommitted to copy "
                "it anyway"
            )
        return offset

    def _skip_lost(self, topic: str, partition: int, offset: int, end: int) -> int:
        where = f"{topic}-{partition}"
        start = list_offsets(self.client, {(topic, partition): EARLIEST})[(topic, partition)]
        if offset < start:
            return self._lost(where, offset, min(start, end), f"the log now starts at {start}")
        marks = watermarks(self.client, {(topic, partition): start})[(topic, partition)]
        return self._lost(where, offset, end, f"the log now ends at {marks.high_watermark}")

    def _lost(self, where: str, offset: int, resume: int, why: str) -> int:
        text = (
            f"{where}: offsets {offset} to {resume - 1} are no longer in {self.client.where} "
            f"({why}): they were deleted (retention, DeleteRecords) or truncated before they "
            "were read"
        )
        if self.config.fail_on_data_loss:
            raise DataLossError(
                f"{text}. The records are lost. To skip them and continue, set "
                "failOnDataLoss=false (kipside mirror: --no-fail-on-data-loss)"
            )
        if self._on_data_loss is not None:
            self._on_data_loss(f"{text}; skipped (failOnDataLoss=false)")
        return resume
