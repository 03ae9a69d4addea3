"""Columnar topics in the sidecar, sans-I/O: the batches a client produces to a columnar topic
become carriers, and the carriers a broker answers a Fetch with become ordinary batches again.

docs/columnar.md says what users see; in short:

- **Produce.** Each batch (one per partition: Produce v3+) of a topic a `columnar` rule matches,
  with at least the rule's `smallest_batch` records, is replaced by its carrier. The carrier
  keeps the batch's offsets, record count, timestamps, producer id, epoch, sequence and
  transactional bit, so the broker assigns, checks and acknowledges it as the client's batch,
  and the client gets the broker's answer as it is. A batch the encoder leaves alone (a value
  that doesn't fit the schema, a malformed batch, a carrier already) goes on unchanged, or,
  under a rule that `refuses_misfits` (the default with encryption), is answered
  INVALID_RECORD without reaching the broker. Nothing is ever dropped silently.
- **Fetch.** In the answer, every carrier of a columnar topic becomes the ordinary batch its
  producer sent (uncompressed), header fields unchanged; ordinary batches, control batches and
  the cut batch at the end stay as they are. A carrier that can't be decoded (no key for its
  encrypted columns, a newer version, corrupt) goes to the client as it is. The answer stays
  within the client's own max_bytes: past it, a partition's later batches are left for its
  next Fetch (every partition keeps its first batch, so each makes progress).

The work is done by plain functions on frames, no I/O: the stage (stages.columnar) decides in
the event loop whether a request or answer has anything to convert (cheap), and the costly part
runs in a worker thread (session.offload). That part touches nothing shared but the encoder
pools (a taken encoder is one thread's) and the counts, added under their lock. Imports the
columnar codec (pyarrow) only when it first converts something.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from kipside.protocol import (
    ApiKey,
    ColumnarError,
    Compression,
    DecodeError,
    DecodeLimits,
    Encoded,
    ErrorCode,
    FetchResponseData,
    NotEncodable,
    NotEncodableKind,
    PartitionBatch,
    PartitionResult,
    ProduceRequestData,
    ProduceResponseData,
    RecordBatchError,
    RecordBatchView,
    RequestHeader,
    build_frame,
    encode_produce_request,
    encode_produce_response,
    fetch_request_max_bytes,
    iter_batches,
    merge_produce_response,
    parse_fetch_response,
    parse_produce_request,
    parse_produce_response,
    parse_response_header,
    replace_fetch_records,
    response_frame,
)
from kipside.proxy.core.decisions import Answer, Decision, Narrow, chain
from kipside.proxy.telemetry.stats import ColumnarCounts, ColumnarTally
from kipside.rules import ColumnarRule, RuleSet

if TYPE_CHECKING:
    from kipside.protocol import ColumnarEncoder

__all__ = [
    "FETCH_COMPRESSION",
    "FETCH_VERSIONS",
    "PRODUCE",
    "REFUSED",
    "ColumnarTopics",
    "has_columnar_topics",
    "warm_up",
]

log = logging.getLogger("kipside.columnar")

PRODUCE: Final = "produce"
FETCH: Final = "fetch"
# Outcomes, as kipside_columnar_batches_total{direction, outcome} names them.
CONVERTED: Final = "converted"
SMALL: Final = "small"
REFUSED: Final = "refused"
DEFERRED: Final = "deferred"
UNDECODABLE: Final = "undecodable"
_PASSED: Final = {
    NotEncodableKind.MISFIT: "misfit",
    NotEncodableKind.MALFORMED: "malformed",
    NotEncodableKind.CARRIER: "carrier",
}
FETCH_VERSIONS: Final = range(4, 13)
"""The Fetch versions whose answers are converted: v13+ name topics by id, so kipside
advertises Fetch up to v12 while any topic is columnar (stages.versions)."""
FETCH_COMPRESSION: Final = Compression.NONE
"""What consumers get: uncompressed batches. kipside sits next to them (loopback or a pod's
network), where bytes are cheap and CPU is not, and every client reads an uncompressed batch
whatever codec libraries it was built with."""


def has_columnar_topics(rules: RuleSet) -> bool:
    """Whether any topic rule is columnar (else the stage is left out of the pipeline)."""
    return any(rule.columnar is not None for rule in rules.topics)


def warm_up() -> float:
    """Load the columnar codec (pyarrow, the compiled record kernels) and run it once on a
    one-record batch, so that a client's first batch doesn't wait a second or more for it.
    Returns the seconds it took."""
    started = time.monotonic()
    import pyarrow as pa

    from kipside.protocol import ColumnarEncoder, Record, encode_batch, reencode_if_carrier

    encoder = ColumnarEncoder(pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    carrier = encoder.encode(encode_batch([Record(b"k", b'{"id":1}')], base_timestamp=0))
    assert isinstance(carrier, Encoded), carrier
    reencode_if_carrier(carrier.batch)
    return time.monotonic() - started


@dataclass(frozen=True, slots=True)
class _Converting:
    """One batch of a ProduceRequest to encode: its position in the request and its rule."""

    index: int
    rule: ColumnarRule
    view: RecordBatchView


class _Once:
    """Topics something was logged about already (one line per topic and kind)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def first(self, topic: str, kind: str) -> bool:
        with self._lock:
            if (topic, kind) in self._seen:
                return False
            self._seen.add((topic, kind))
            return True


class _RuleTopics:
    """One rule set's columnar rule per topic, and the encoders of each (rule, topic): a topic's
    encoder keeps what it learnt of the topic's columns (which encodings pay). Replaced, with
    every encoder, when the rules are."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._rule: dict[str, ColumnarRule | None] = {}
        self._encoders: dict[tuple[int, str], list[ColumnarEncoder]] = {}

    def rule_for(self, topic: str) -> ColumnarRule | None:
        try:
            return self._rule[topic]
        except KeyError:
            rule = self._rule[topic] = self.rules.columnar_for(topic)
            return rule

    def encoder(self, rule: ColumnarRule, topic: str) -> ColumnarEncoder:
        """An encoder for this thread's use; give it back when done."""
        pool = self._encoders.setdefault((id(rule), topic), [])
        try:
            return pool.pop()
        except IndexError:
            from kipside.protocol import ColumnarEncoder

            return ColumnarEncoder(rule.arrow_schema(), rule.options())

    def give_back(self, rule: ColumnarRule, topic: str, encoder: ColumnarEncoder) -> None:
        self._encoders[(id(rule), topic)].append(encoder)


class ColumnarTopics:
    """The columnar stage's logic (one per server): what to convert, and converting it."""

    def __init__(self, counts: ColumnarCounts) -> None:
        self.counts = counts
        self._topics: _RuleTopics | None = None
        self._once = _Once()

    def _for(self, rules: RuleSet) -> _RuleTopics:
        topics = self._topics
        if topics is None or topics.rules is not rules:
            topics = self._topics = _RuleTopics(rules)
        return topics

    # Produce ----------------------------------------------------------------------------

    def produce_work(
        self,
        rules: RuleSet,
        frame: bytes,
        header: RequestHeader,
        limits: DecodeLimits,
        client: Callable[[], str],
    ) -> Callable[[], Decision | None] | None:
        """The work that converts a ProduceRequest's batches of columnar topics (to run off the
        event loop), or None when none is to be converted (counted as it stands). Raises
        LimitExceeded past the rules' caps; a request kipside can't read goes on as it is."""
        if header.api_version < 3:  # message sets of magic 0 and 1: no record batches
            return None
        try:
            produce = parse_produce_request(frame, header.body_offset, header.api_version, limits)
        except DecodeError:
            return None  # the broker answers what kipside can't read
        topics = self._for(rules)
        converting: list[_Converting] = []
        small = 0
        for index, sent in enumerate(produce.partitions):
            rule = topics.rule_for(sent.topic)
            if rule is None or sent.records is None or not len(sent.records):
                continue
            try:
                view = RecordBatchView.from_buffer(sent.records)
            except RecordBatchError:
                continue  # the broker refuses it
            if view.size != len(sent.records) or view.magic != 2:
                continue  # more than one batch, or an old format: the broker decides
            if view.records_count < rule.smallest_batch:
                small += 1
                continue
            converting.append(_Converting(index, rule, view))
        if small:
            tally = ColumnarTally()
            tally.batches[PRODUCE, SMALL] += small
            self.counts.add(tally)
        if not converting:
            return None
        return functools.partial(
            self._convert_produce, topics, frame, header, produce, converting, client
        )

    def _convert_produce(
        self,
        topics: _RuleTopics,
        frame: bytes,
        header: RequestHeader,
        produce: ProduceRequestData,
        converting: list[_Converting],
        client: Callable[[], str],
    ) -> Decision | None:
        started = time.thread_time()
        tally = ColumnarTally()
        sent = list(produce.partitions)
        refused: dict[tuple[str, int], PartitionResult] = {}
        changed = False
        for item in converting:
            batch = sent[item.index]
            encoder = topics.encoder(item.rule, batch.topic)
            try:
                result = encoder.encode(item.view)
            finally:
                topics.give_back(item.rule, batch.topic, encoder)
            if isinstance(result, Encoded):
                sent[item.index] = PartitionBatch(
                    batch.topic, batch.partition, memoryview(result.batch)
                )
                changed = True
                tally.batches[PRODUCE, CONVERTED] += 1
                tally.records[PRODUCE] += result.records
                tally.ordinary_bytes[PRODUCE] += result.original_bytes
                tally.carrier_bytes[PRODUCE] += len(result.batch)
                continue
            if result.kind is not NotEncodableKind.CARRIER and item.rule.refuses_misfits:
                refused[(batch.topic, batch.partition)] = _refusal(batch, result)
                tally.batches[PRODUCE, REFUSED] += 1
                self._note(batch.topic, REFUSED, client, result, refused=True)
                continue
            outcome = _PASSED[result.kind]
            tally.batches[PRODUCE, outcome] += 1
            self._note(batch.topic, outcome, client, result, refused=False)
        tally.spent(PRODUCE, time.thread_time() - started)
        self.counts.add(tally)
        if not changed and not refused:
            return None
        decision = _produce_decision(frame, header, produce, sent, refused)
        if type(decision) is Narrow and produce.acks != 0 and changed:
            carriers = frozenset(
                (b.topic, b.partition)
                for item in converting
                if (b := sent[item.index]) is not produce.partitions[item.index]
            )
            watch = functools.partial(self._answered, header.api_version, carriers)
            merge = decision.merge
            decision = Narrow(decision.frame, watch if merge is None else chain(watch, merge))
        return decision

    def _answered(self, version: int, carriers: frozenset[tuple[str, int]], answer: bytes) -> bytes:
        """The broker's answer, as it is, after a look for carriers it refused as invalid (a
        compacted topic refuses them: their placeholders have no key), logged once per topic."""
        try:
            head = parse_response_header(answer, ApiKey.PRODUCE, version)
            results = parse_produce_response(answer, head.body_offset, version).partitions
        except DecodeError:
            return answer  # the client reads the broker's answer as it can
        for r in results:
            refused = (
                r.error_code == ErrorCode.invalid_record and (r.topic, r.partition) in carriers
            )
            if refused and self._once.first(r.topic, "broker refused"):
                log.warning(
                    "the broker refused carriers of columnar topic %s as invalid records "
                    "(%s); a compacted topic (cleanup.policy=compact) refuses them, as their "
                    "placeholder records have no key: exempt such a topic from the columnar "
                    "rule with an entry without columnar before it",
                    r.topic,
                    r.error_message or "INVALID_RECORD, no message",
                )
        return answer

    def _note(
        self,
        topic: str,
        kind: str,
        client: Callable[[], str],
        result: NotEncodable,
        *,
        refused: bool,
    ) -> None:
        if not self._once.first(topic, kind):
            return
        if refused:
            log.warning(
                "%s: a batch to columnar topic %s was refused (INVALID_RECORD): %s; its rule "
                "refuses what can't become a carrier, so no encrypted field reaches the broker "
                'in plaintext (counted in kipside_columnar_batches_total{outcome="refused"}; '
                "later ones on this topic are not logged)",
                client(),
                topic,
                result,
            )
            return
        log.warning(
            "%s: a batch to columnar topic %s went to the broker as it was, not as a carrier "
            '(%s): %s (counted in kipside_columnar_batches_total{outcome="%s"}; later ones on '
            "this topic are not logged)",
            client(),
            topic,
            result.kind.value,
            result,
            kind,
        )

    # Fetch ------------------------------------------------------------------------------

    def fetch_convert(
        self, rules: RuleSet, frame: bytes, header: RequestHeader
    ) -> Callable[[bytes], Callable[[], bytes] | None] | None:
        """What converts the broker's answer to this FetchRequest (core.decisions.AnswerConvert),
        or None for a Fetch version whose answers aren't converted."""
        version = header.api_version
        if version not in FETCH_VERSIONS:
            return None
        try:
            budget = fetch_request_max_bytes(frame, header.body_offset, version)
        except DecodeError:
            return None
        return functools.partial(self._fetch_work, self._for(rules), version, budget)

    def _fetch_work(
        self, topics: _RuleTopics, version: int, budget: int, answer: bytes
    ) -> Callable[[], bytes] | None:
        """The work that converts the carriers in `answer`, or None when it holds no records
        of a columnar topic (checked in the event loop: no batch is read)."""
        try:
            head = parse_response_header(answer, ApiKey.FETCH, version)
            data = parse_fetch_response(answer, head.body_offset, version)
        except DecodeError:
            return None  # the client reads what it can of the broker's answer
        columnar = {
            index: rule
            for index, partition in enumerate(data.partitions)
            if len(partition.records) and (rule := topics.rule_for(partition.topic)) is not None
        }
        if not columnar:
            return None
        return functools.partial(
            self._convert_fetch, answer, head.body_offset, version, data, columnar, budget
        )

    def _convert_fetch(
        self,
        answer: bytes,
        body_offset: int,
        version: int,
        data: FetchResponseData,
        columnar: dict[int, ColumnarRule],
        budget: int,
    ) -> bytes:
        from kipside.protocol import reencode_if_carrier

        started = time.thread_time()
        tally = ColumnarTally()
        total = 0
        replaced: dict[int, bytes] = {}
        for index, partition in enumerate(data.partitions):
            records = partition.records
            rule = columnar.get(index)
            if rule is None:
                total += len(records)
                continue
            pieces: list[bytes | memoryview] = []
            changed = deferred = False
            read = 0
            for view in iter_batches(records, allow_partial_tail=True):
                read += view.size
                if pieces and total >= budget:
                    tally.batches[FETCH, DEFERRED] += 1
                    changed = deferred = True  # left for the partition's next Fetch
                    continue
                try:
                    ordinary = reencode_if_carrier(view, rule.keys, compression=FETCH_COMPRESSION)
                except ColumnarError as exc:
                    ordinary = None
                    tally.batches[FETCH, UNDECODABLE] += 1
                    self._undecodable(partition.topic, partition.partition, exc)
                if ordinary is None:
                    pieces.append(view.raw)
                    total += view.size
                    continue
                pieces.append(ordinary)
                total += len(ordinary)
                changed = True
                tally.batches[FETCH, CONVERTED] += 1
                tally.records[FETCH] += view.records_count
                tally.ordinary_bytes[FETCH] += len(ordinary)
                tally.carrier_bytes[FETCH] += view.size
            if not changed:
                continue
            if read < len(records) and not deferred:
                pieces.append(records[read:])  # the cut batch the broker ended with
            replaced[index] = b"".join(pieces)
        tally.spent(FETCH, time.thread_time() - started)
        self.counts.add(tally)
        if not replaced:
            return answer
        return replace_fetch_records(answer, body_offset, version, replaced)

    def _undecodable(self, topic: str, partition: int, problem: ColumnarError) -> None:
        if self._once.first(topic, UNDECODABLE):
            log.warning(
                "a carrier of columnar topic %s (partition %d) went to a consumer as it is: %s "
                '(counted in kipside_columnar_batches_total{outcome="undecodable"}; later '
                "ones on this topic are not logged)",
                topic,
                partition,
                problem,
            )


def _refusal(batch: PartitionBatch, result: NotEncodable) -> PartitionResult:
    message = (
        f"kipside: topic {batch.topic} is columnar and refuses batches that can't become "
        f"carriers: {result}"
    )
    record_errors = () if result.record is None else ((result.record, str(result)),)
    return PartitionResult(
        batch.topic,
        batch.partition,
        ErrorCode.invalid_record,
        record_errors=record_errors,
        error_message=message,
    )


def _produce_decision(
    frame: bytes,
    header: RequestHeader,
    produce: ProduceRequestData,
    sent: list[PartitionBatch],
    refused: dict[tuple[str, int], PartitionResult],
) -> Decision:
    """The request with its carriers, without the refused partitions, whose answers are added
    to the broker's (or are the whole answer)."""
    version = header.api_version
    kept = [b for b in sent if (b.topic, b.partition) not in refused]
    narrowed = None
    if kept:
        body = encode_produce_request(
            version,
            acks=produce.acks,
            timeout_ms=produce.timeout_ms,
            partitions=kept,
            transactional_id=produce.transactional_id,
        )
        narrowed = build_frame(bytes(frame[4 : header.body_offset]), b"".join(body))
    if not refused:
        return Narrow(narrowed)
    if produce.acks == 0:  # no answer to carry the error: Kafka closes the connection
        topics = ", ".join(sorted({topic for topic, _ in refused}))
        return Narrow(
            narrowed,
            close=f"sent an acks=0 Produce with batches columnar topic {topics} refuses; "
            "Apache Kafka closes an acks=0 producer's connection on any error, and so does "
            "kipside, after forwarding the rest",
        )
    order = [(b.topic, b.partition) for b in sent]
    if narrowed is None:
        answer = ProduceResponseData(tuple(refused[where] for where in order))
        return Answer(response_frame(header, encode_produce_response(version, answer)))
    return Narrow(
        narrowed,
        functools.partial(merge_produce_response, version=version, sent=order, added=refused),
    )
