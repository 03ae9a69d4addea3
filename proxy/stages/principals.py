"""The rule file's `principals` section, applied: what a principal may use through kipside.

kipside only ever narrows: a request it allows still goes to the broker, which authorizes it as
the principal's own login, so kipside can never widen what the broker allows. A request naming
something the principal's rule does not allow is answered here, as Apache Kafka answers an
unauthorized one:

- InitProducerId, AddPartitionsToTxn (v0-3), AddOffsetsToTxn, EndTxn and TxnOffsetCommit with a
  transactional id outside `transactional_ids`, and a transactional Produce of such an id:
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
- Produce, Fetch and ListOffsets partitions of a topic outside `topics`:
  TOPIC_AUTHORIZATION_FAILED for those partitions. A request that also names allowed topics
  goes on without the refused ones (a `Narrow` decision), and the broker's answer gets
  the refused partitions added, each where the client's request had it, as Apache Kafka
  answers a request naming authorized and unauthorized topics. A Produce v3+ keeps the
  allowed partitions' record batches byte for byte (protocol.produce, as the coalescer builds
  requests); Fetch, ListOffsets and Produce v0-2 are re-encoded by kio without the refused
  topics. An acks=0 Produce has no answer to carry an error: its allowed part goes on, then
  the connection is closed, as Kafka closes an acks=0 producer's connection on any error.

Fetch from v13 names topics by id, not by name, so while any rule restricts topics kipside
advertises Fetch up to v12 (stages.versions). Decodes only requests of principals that have a
rule; every other request stays bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from kipside.protocol import (
    ApiKey,
    DecodeError,
    DecodeLimits,
    ErrorCode,
    LimitExceeded,
    Message,
    PartitionBatch,
    PartitionResult,
    ProduceResponseData,
    RequestHeader,
    api_name,
    blank,
    build_frame,
    decode_request,
    decode_response,
    encode_message,
    encode_produce_request,
    encode_produce_response,
    field_entity,
    parse_produce_request,
    parse_produce_response,
    parse_response_header,
    response_class,
    response_frame,
)
from kipside.proxy.core.decisions import Answer, ClientHandle, ClientRequest, Decision, Narrow
from kipside.proxy.stages.transactions import add_offsets_answer, add_partitions_answer
from kipside.rules import PrincipalRule, RuleSet

log = logging.getLogger("kipside.principals")

TOPIC_REFUSED: Final = ErrorCode.topic_authorization_failed
TXN_REFUSED: Final = ErrorCode.transactional_id_authorization_failed
FETCH_BY_NAME_MAX_VERSION: Final = 12
TRANSACTIONAL_APIS: Final = frozenset(
    {
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.TXN_OFFSET_COMMIT,
    }
)
# (request topics, request partitions, partition field, response topics, response partitions,
#  response partition field) of the partition-led APIs.
_PARTITIONED: Final[dict[int, tuple[str, str, str, str, str]]] = {
    ApiKey.PRODUCE: ("topic_data", "partition_data", "index", "responses", "partition_responses"),
    ApiKey.FETCH: ("topics", "partitions", "partition", "responses", "partitions"),
    ApiKey.LIST_OFFSETS: ("topics", "partitions", "partition_index", "topics", "partitions"),
}
Verdict = bytes | Narrow | None
_RESPONSE_INDEX: Final[dict[int, str]] = {
    ApiKey.PRODUCE: "index",
    ApiKey.FETCH: "partition_index",
    ApiKey.LIST_OFFSETS: "partition_index",
}


@dataclass(frozen=True, slots=True)
class PrincipalRules:
    """The principals stage: what each principal may send, by the rule file's principals
    section."""

    api_keys: ClassVar[frozenset[int]] = TRANSACTIONAL_APIS | frozenset(_PARTITIONED)
    """The requests a rule may restrict; the stage is asked about no others."""
    rules: Callable[[], RuleSet]
    # Per client connection, the APIs whose refusal was logged at info: a consumer retries a
    # refused Fetch every fetch.error.backoff.ms, and kipside logs no line per request.
    _logged: weakref.WeakKeyDictionary[ClientHandle, set[int]] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def __call__(self, request: ClientRequest) -> Decision | None:
        verdict = self.refusal(request.client, request.frame, request.header)
        if verdict is None or type(verdict) is Narrow:
            return verdict
        assert isinstance(verdict, bytes)
        return Answer(verdict)

    def refusal(
        self, client: ClientHandle, frame: bytes, header: RequestHeader
    ) -> bytes | Narrow | None:
        """kipside's answer refusing the request, the part of it that may go on (Narrow), or
        None if the principal may send all of it."""
        rules = self.rules()
        if not rules.principals:
            return None
        rule = rules.principal_rule_for(client.principal.name)
        if rule is None:
            return None
        key = header.api_key
        if key not in TRANSACTIONAL_APIS and key not in _PARTITIONED:
            return None
        if rule.topics is None and rule.transactional_ids is None:
            return None
        try:
            verdict = self._verdict(rule, frame, header)
        except LimitExceeded:
            raise  # over a cap of the rules' limits: the session closes the client
        except DecodeError:
            return None  # the broker answers what kipside can't read
        if verdict is not None:
            self._log(client, header, rule, isinstance(verdict, Narrow) and bool(verdict.frame))
        return verdict

    def _log(
        self, client: ClientHandle, header: RequestHeader, rule: PrincipalRule, part: bool
    ) -> None:
        logged = self._logged.setdefault(client, set())
        first = header.api_key not in logged
        logged.add(header.api_key)
        log.log(
            logging.INFO if first else logging.DEBUG,
            "%s: %s v%d %s by the principals rule for %s%s",
            client.describe(),
            api_name(header.api_key),
            header.api_version,
            "refused in part (the allowed partitions go on)" if part else "refused",
            rule.principal,
            " (more on this connection are logged at debug)" if first else "",
        )

    def _verdict(self, rule: PrincipalRule, frame: bytes, header: RequestHeader) -> Verdict:
        key, version = header.api_key, header.api_version
        if key == ApiKey.PRODUCE and version >= 3:
            return _produce_verdict(rule, frame, header, self.rules().limits.decode_limits)
        if key in _PARTITIONED:  # Fetch, ListOffsets, Produce v0-2 (no transactional id)
            return None if rule.topics is None else _topics_verdict(rule, frame, header)
        if rule.transactional_ids is None:
            return None
        request = decode_request(key, version, frame, header.body_offset)
        tid = _transactional_id(request)
        if tid is None or rule.allows_transactional_id(tid):
            return None
        return _transactional_answer(header, request)


# Produce v3+ (protocol.produce: the allowed partitions' batches are carried as they came) ----


def _produce_verdict(
    rule: PrincipalRule, frame: bytes, header: RequestHeader, limits: DecodeLimits
) -> Verdict:
    version = header.api_version
    # limits: the rules' caps on what kipside decodes (LimitExceeded closes the client).
    produce = parse_produce_request(frame, header.body_offset, version, limits)
    sent = produce.partitions
    tid = produce.transactional_id
    code = TOPIC_REFUSED
    refused = frozenset(b.topic for b in sent if not rule.allows_topic(b.topic))
    if tid is not None and not rule.allows_transactional_id(tid):
        refused, code = frozenset(b.topic for b in sent), TXN_REFUSED
    if not refused:
        return None
    kept = [b for b in sent if b.topic not in refused]
    if produce.acks == 0:  # no answer to give: Kafka closes the connection on an error
        narrowed = _produce_frame(frame, header, produce.acks, produce.timeout_ms, tid, kept)
        return Narrow(narrowed, close=_acks0_close(refused, code))
    if not kept:
        answer = ProduceResponseData(
            tuple(PartitionResult(b.topic, b.partition, code) for b in sent)
        )
        return response_frame(header, encode_produce_response(version, answer))
    merge = functools.partial(_merged_produce_answer, version, sent, refused)
    narrowed = _produce_frame(frame, header, produce.acks, produce.timeout_ms, tid, kept)
    return Narrow(narrowed, merge)


def _produce_frame(
    frame: bytes,
    header: RequestHeader,
    acks: int,
    timeout_ms: int,
    transactional_id: str | None,
    kept: list[PartitionBatch],
) -> bytes | None:
    """The client's ProduceRequest (same header) with only the `kept` partitions' batches,
    their bytes copied as they came: never decoded or re-encoded (as the coalescer builds its
    multi-batch requests); None if nothing is kept. (A kept transactional Produce's id is
    allowed: the id refused refuses every partition.)"""
    if not kept:
        return None
    body = encode_produce_request(
        header.api_version,
        acks=acks,
        timeout_ms=timeout_ms,
        partitions=kept,
        transactional_id=transactional_id,
    )
    return build_frame(bytes(frame[4 : header.body_offset]), b"".join(body))


def _merged_produce_answer(
    version: int, sent: tuple[PartitionBatch, ...], refused: frozenset[str], answer: bytes
) -> bytes:
    """The broker's answer to the allowed partitions, with the refused ones added, every
    partition where the client's request had it."""
    head = parse_response_header(answer, ApiKey.PRODUCE, version)
    data = parse_produce_response(answer, head.body_offset, version)
    answered = {(r.topic, r.partition): r for r in data.partitions}
    results = []
    for b in sent:
        if b.topic in refused:
            results.append(PartitionResult(b.topic, b.partition, TOPIC_REFUSED))
        elif (result := answered.pop((b.topic, b.partition), None)) is not None:
            results.append(result)
    results += answered.values()  # (none: the broker answers what it was sent)
    body = encode_produce_response(version, dataclasses.replace(data, partitions=tuple(results)))
    return build_frame(bytes(answer[4 : head.body_offset]), body)


def _acks0_close(refused: frozenset[str], code: ErrorCode) -> str:
    return (
        f"sent an acks=0 Produce to {', '.join(sorted(refused))}, which its principals rule "
        f"refuses ({code.name.upper()}); Apache Kafka closes an acks=0 producer's connection "
        "on any error, and so does kipside, after forwarding the allowed partitions"
    )


# Fetch, ListOffsets, Produce v0-2 (kio: the request re-encoded without the refused topics) -


def _topics_verdict(rule: PrincipalRule, frame: bytes, header: RequestHeader) -> Verdict:
    key, version = header.api_key, header.api_version
    request = decode_request(key, version, frame, header.body_offset)
    topics_field = _PARTITIONED[key][0]
    topics = getattr(request, topics_field)
    refused = frozenset(
        name for t in topics if (name := _name(t)) is not None and not rule.allows_topic(name)
    )
    if not refused:
        return None
    kept = tuple(t for t in topics if _name(t) not in refused)
    narrowed = None
    if kept:
        body = encode_message(dataclasses.replace(request, **{topics_field: kept}))
        narrowed = build_frame(bytes(frame[4 : header.body_offset]), body)
    if key == ApiKey.PRODUCE and request.acks == 0:
        return Narrow(narrowed, close=_acks0_close(refused, TOPIC_REFUSED))
    if narrowed is None:
        return _partitioned_answer(header, request, lambda _t: TOPIC_REFUSED)
    return Narrow(narrowed, functools.partial(_merged_answer, header, request, refused))


def _merged_answer(
    header: RequestHeader, request: Message, refused: frozenset[str], answer: bytes
) -> bytes:
    """The broker's answer to the allowed topics, with the refused topics' partitions added,
    each topic where the client's request had it (a topic the broker added on its own, such
    as a fetch session's, stays, after them)."""
    key, version = header.api_key, header.api_version
    head = parse_response_header(answer, key, version)
    message = decode_response(key, version, answer, head.body_offset)
    topics_field, _, _, out_topics, out_partitions = _PARTITIONED[key]
    topic_cls = field_entity(type(message), out_topics)
    partition_cls = field_entity(topic_cls, out_partitions)
    answered: dict[str | None, list[Any]] = {}
    for topic in getattr(message, out_topics):
        answered.setdefault(_name(topic), []).append(topic)
    topics = []
    for topic in getattr(request, topics_field):
        name = _name(topic)
        if name in refused:
            topics.append(_refused_topic(key, topic_cls, partition_cls, topic, TOPIC_REFUSED))
        elif name is not None and name in answered:
            topics += answered.pop(name)
    topics += [t for left in answered.values() for t in left]
    merged = dataclasses.replace(message, **{out_topics: tuple(topics)})
    return build_frame(bytes(answer[4 : head.body_offset]), encode_message(merged))


def _name(topic: Any) -> str | None:
    for attribute in ("name", "topic"):
        if hasattr(topic, attribute):
            return str(getattr(topic, attribute))
    return None  # by topic id


def _transactional_id(request: Message) -> str | None:
    tid = getattr(request, "transactional_id", None)
    if tid is None and hasattr(request, "v3_and_below_transactional_id"):
        tid = request.v3_and_below_transactional_id
    return None if tid is None else str(tid)


# Answers ------------------------------------------------------------------------------------


def _frame(header: RequestHeader, message: Message) -> bytes:
    return response_frame(header, encode_message(message))


def _refused_topic(key: int, topic_cls: Any, partition_cls: Any, topic: Any, error: int) -> Any:
    """The answer's entry for one request topic: each of its partitions with `error`."""
    _, partitions_field, index_field, _, out_partitions = _PARTITIONED[key]
    name = _name(topic)
    naming = {"name": name, "topic": name, "topic_id": getattr(topic, "topic_id", None)}
    # A Fetch error partition carries empty records, not null ones (Kafka's MemoryRecords.EMPTY:
    # librdkafka refuses a null record set as a protocol error).
    partitions = tuple(
        blank(
            partition_cls,
            **{_RESPONSE_INDEX[key]: getattr(p, index_field), "error_code": error, "records": b""},
        )
        for p in getattr(topic, partitions_field)
    )
    return blank(topic_cls, **naming, **{out_partitions: partitions})


def _partitioned_answer(
    header: RequestHeader, request: Message, error: Callable[[str | None], ErrorCode]
) -> bytes:
    """Every partition the request names, in its order, with error(topic)."""
    key = header.api_key
    topics_field, _, _, out_topics, out_partitions = _PARTITIONED[key]
    cls = response_class(key, header.api_version)
    topic_cls = field_entity(cls, out_topics)
    partition_cls = field_entity(topic_cls, out_partitions)
    topics = tuple(
        _refused_topic(key, topic_cls, partition_cls, topic, error(_name(topic)))
        for topic in getattr(request, topics_field)
    )
    return _frame(header, blank(cls, **{out_topics: topics, "error_code": ErrorCode.none}))


def _transactional_answer(header: RequestHeader, request: Message) -> bytes:
    key = header.api_key
    if key == ApiKey.ADD_PARTITIONS_TO_TXN:
        errors = {
            (topic.name, int(p)): int(TXN_REFUSED)
            for topic in request.v3_and_below_topics
            for p in topic.partitions
        }
        return add_partitions_answer(header, request, errors)
    if key == ApiKey.ADD_OFFSETS_TO_TXN:
        return add_offsets_answer(header, int(TXN_REFUSED))
    cls = response_class(key, header.api_version)
    if key == ApiKey.TXN_OFFSET_COMMIT:
        topic_cls = field_entity(cls, "topics")
        partition_cls = field_entity(topic_cls, "partitions")
        topics = tuple(
            blank(
                topic_cls,
                name=topic.name,
                partitions=tuple(
                    blank(partition_cls, partition_index=p.partition_index, error_code=TXN_REFUSED)
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        )
        return _frame(header, blank(cls, topics=topics))
    return _frame(header, blank(cls, error_code=TXN_REFUSED))
