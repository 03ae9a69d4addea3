"""The rule file's `principals` section, applied: what a principal may use through kipside.

kipside only ever narrows: a request it allows still goes to the broker, which authorizes it as
the principal's own login, so kipside can never widen what the broker allows. A request naming
something the principal's rule does not allow is answered here, as Apache Kafka answers an
unauthorized one:

- InitProducerId, AddPartitionsToTxn (v0-3), AddOffsetsToTxn, EndTxn and TxnOffsetCommit with a
  transactional id outside `transactional_ids`, and a transactional Produce of such an id:
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
- Produce, Fetch and ListOffsets partitions of a topic outside `topics`:
  TOPIC_AUTHORIZATION_FAILED for those partitions. A request that also names allowed topics is
  not split (not yet): its allowed partitions are answered NOT_LEADER_OR_FOLLOWER, which every
  client retries after a metadata refresh, without the refused topic.

Fetch from v13 names topics by id, not by name, so while any rule restricts topics kipside
advertises Fetch up to v12 (features.versions). Decodes only requests of principals that have a
rule; every other request stays bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import logging
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kipside.protocol import (
    ApiKey,
    DecodeError,
    ErrorCode,
    Message,
    RequestHeader,
    build_frame,
    decode_request,
    encode_message,
    encode_response_header,
    parse_produce_request,
    response_class,
)
from kipside.proxy.features.transactions import add_offsets_answer, add_partitions_answer
from kipside.proxy.network.hooks import RoutedClient
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
_RESPONSE_INDEX: Final[dict[int, str]] = {
    ApiKey.PRODUCE: "index",
    ApiKey.FETCH: "partition_index",
    ApiKey.LIST_OFFSETS: "partition_index",
}


@dataclass(frozen=True, slots=True)
class PrincipalRules:
    """The server's request check (network.hooks.RequestCheck) for the principals section."""

    rules: Callable[[], RuleSet]

    def refusal(self, client: RoutedClient, frame: bytes, header: RequestHeader) -> bytes | None:
        """kipside's answer refusing the request, or None if the principal may send it."""
        rules = self.rules()
        if not rules.principals:
            return None
        rule = rules.principal_rule_for(client.principal.name)
        if rule is None:
            return None
        key = header.api_key
        if key not in TRANSACTIONAL_APIS and key not in _PARTITIONED:
            return None
        try:
            answer = self._refusal(rule, frame, header)
        except DecodeError:
            return None  # the broker answers what kipside can't read
        if answer is not None:
            log.info(
                "%s: %s v%d refused by the principals rule for %s",
                client.describe(),
                ApiKey(key).name,
                header.api_version,
                rule.principal,
            )
        return answer

    def _refusal(self, rule: PrincipalRule, frame: bytes, header: RequestHeader) -> bytes | None:
        key, version = header.api_key, header.api_version
        if key == ApiKey.PRODUCE and rule.transactional_ids is not None:
            produce = parse_produce_request(frame, header.body_offset, version)
            tid = produce.transactional_id
            if tid is not None and not rule.allows_transactional_id(tid):
                request = decode_request(key, version, frame, header.body_offset)
                return _partitioned_answer(header, request, lambda _t: TXN_REFUSED)
        if key in _PARTITIONED:
            if rule.topics is None:
                return None
            request = decode_request(key, version, frame, header.body_offset)
            topics = [_name(t) for t in getattr(request, _PARTITIONED[key][0])]
            refused = {t for t in topics if t is not None and not rule.allows_topic(t)}
            if not refused:
                return None
            return _partitioned_answer(
                header,
                request,
                lambda t: TOPIC_REFUSED if t in refused else ErrorCode.not_leader_or_follower,
            )
        if rule.transactional_ids is None:
            return None
        request = decode_request(key, version, frame, header.body_offset)
        tid = _transactional_id(request)
        if tid is None or rule.allows_transactional_id(tid):
            return None
        return _transactional_answer(header, request)


def _name(topic: Any) -> str | None:
    for field in ("name", "topic"):
        if hasattr(topic, field):
            return str(getattr(topic, field))
    return None  # by topic id


def _transactional_id(request: Message) -> str | None:
    tid = getattr(request, "transactional_id", None)
    if tid is None and hasattr(request, "v3_and_below_transactional_id"):
        tid = request.v3_and_below_transactional_id
    return None if tid is None else str(tid)


# Answers ------------------------------------------------------------------------------------


def _frame(header: RequestHeader, message: Message) -> bytes:
    head = encode_response_header(header.api_key, header.api_version, header.correlation_id)
    return build_frame(head, encode_message(message))


def _entity(cls: Any, field: str) -> Any:
    hint = typing.get_type_hints(cls)[field]
    while typing.get_origin(hint) in (tuple, typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a not in (type(None), Ellipsis))
    return hint


def _unknown(hint: Any) -> Any:
    """Kafka's "nothing known" for a field without a default (-1, "", empty, null)."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        return None
    if hint is bool:
        return False
    if hint is str:
        return ""
    if hint is bytes:
        return b""
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return hint(0)
    if isinstance(hint, type) and issubclass(hint, datetime.timedelta):
        return datetime.timedelta(0)
    if isinstance(hint, type) and issubclass(hint, int):
        return -1
    if dataclasses.is_dataclass(hint):
        return _blank(hint)
    raise TypeError(f"no blank value for {hint!r}")


def _blank(cls: Any, **values: Any) -> Any:
    """An entity of `cls`: `values` where the version has the field, the rest unknown."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _unknown(hints[f.name])
    return cls(**kwargs)


def _partitioned_answer(
    header: RequestHeader, request: Message, error: Callable[[str | None], ErrorCode]
) -> bytes:
    """Every partition the request names, in its order, with error(topic)."""
    key = header.api_key
    topics_field, partitions_field, index_field, out_topics, out_partitions = _PARTITIONED[key]
    cls = response_class(key, header.api_version)
    topic_cls = _entity(cls, out_topics)
    partition_cls = _entity(topic_cls, out_partitions)
    topics = []
    for topic in getattr(request, topics_field):
        name = _name(topic)
        naming = {"name": name, "topic": name, "topic_id": getattr(topic, "topic_id", None)}
        partitions = tuple(
            _blank(
                partition_cls,
                **{_RESPONSE_INDEX[key]: getattr(p, index_field), "error_code": error(name)},
            )
            for p in getattr(topic, partitions_field)
        )
        topics.append(_blank(topic_cls, **naming, **{out_partitions: partitions}))
    return _frame(header, _blank(cls, **{out_topics: tuple(topics), "error_code": ErrorCode.none}))


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
        topic_cls = _entity(cls, "topics")
        partition_cls = _entity(topic_cls, "partitions")
        topics = tuple(
            _blank(
                topic_cls,
                name=topic.name,
                partitions=tuple(
                    _blank(partition_cls, partition_index=p.partition_index, error_code=TXN_REFUSED)
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        )
        return _frame(header, _blank(cls, topics=topics))
    return _frame(header, _blank(cls, error_code=TXN_REFUSED))
