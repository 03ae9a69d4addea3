"""The rule file's `principals` section: first match wins, absent keys allow everything, and
the loader's FILE:LINE messages for it; a request naming allowed and refused topics goes on
without the refused ones, whose errors are merged into the broker's answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from kipside.protocol import (
    ApiKey,
    ErrorCode,
    PartitionBatch,
    PartitionResult,
    ProduceResponseData,
    build_frame,
    encode_produce_request,
    encode_produce_response,
    encode_request_header,
    encode_response_header,
    messages,
    parse_produce_request,
    parse_produce_response,
    parse_request_header,
    parse_response_header,
)
from kipside.protocol.batch_builder import Record, encode_batch
from kipside.proxy.core.decisions import ClientHandle, Narrow
from kipside.proxy.core.identity import Principal
from kipside.proxy.stages.principals import PrincipalRules
from kipside.rules import RuleError, parse_rules

RULES = """\
principals:
  - principal: "User:alice"
    topics: ["orders.*", "audit"]
    transactional_ids: ["orders-*"]
  - principal: "User:app-*"
    transactional_ids: []
"""


def test_lookup() -> None:
    rules = parse_rules(RULES, "p.yaml")
    alice = rules.principal_rule_for("User:alice")
    assert alice is not None
    assert alice.allows_topic("orders.eu") and alice.allows_topic("audit")
    assert not alice.allows_topic("audit.x") and not alice.allows_topic("payments")
    assert alice.allows_transactional_id("orders-1") and not alice.allows_transactional_id("x")
    app = rules.principal_rule_for("User:app-7")
    assert app is not None and app.allows_topic("anything")
    assert not app.allows_transactional_id("anything")  # [] allows none
    assert rules.principal_rule_for("User:bob") is None  # no entry: kipside restricts nothing
    assert rules.describe()["principals"][1] == {"principal": "User:app-*", "transactional_ids": []}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "principals:\n  - topics: [a]\n",
            "p.yaml:2: principals[0].principal: missing required key 'principal'",
        ),
        (
            "principals:\n  - principal: User:a\n    topic: [a]\n",
            "p.yaml:3: principals[0].topic: unknown key 'topic' (did you mean 'topics'?)",
        ),
        (
            "principals:\n  - principal: User:a\n    topics: orders.*\n",
            "p.yaml:3: principals[0].topics: expected a list of glob patterns",
        ),
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(RuleError) as refused:
        parse_rules(text, "p.yaml")
    assert str(refused.value).startswith(message), str(refused.value)


# --------------------------------------------------------------------------- mixed requests
# A request naming a topic the principal may use and one it may not: the allowed part goes on
# (Narrow), and the broker's answer to it gets the refused partitions back in the client's
# order (features.principals), as Apache Kafka answers such a request.


ALICE = Principal("User:alice", "sasl")


@dataclass(eq=False)  # hashable, as a session is (the check keeps a weak reference per client)
class _Client:
    principal: Principal = ALICE

    def describe(self) -> str:
        return "client 127.0.0.1:1 (User:alice)"


CLIENT = cast(ClientHandle, _Client())  # what the check reads of a session: principal, describe


CHECK = PrincipalRules(lambda: parse_rules(RULES, "p.yaml"))
# (topic, partition) in the client's order: audit and orders.eu allowed, payments refused
SENT = [("payments", 0), ("orders.eu", 1), ("orders.eu", 0), ("audit", 2), ("payments", 1)]


def _frame(api_key: int, version: int, body: bytes | list[Any]) -> bytes:
    head = encode_request_header(api_key, version, 7, "test")
    return build_frame(head, b"".join(bytes(c) for c in body) if isinstance(body, list) else body)


def _produce(acks: int) -> tuple[bytes, dict[tuple[str, int], bytes]]:
    batches = {tp: encode_batch([Record(b"k", f"{tp}".encode())], base_timestamp=1) for tp in SENT}
    body = encode_produce_request(
        9,
        acks=acks,
        timeout_ms=1000,
        partitions=[PartitionBatch(t, p, memoryview(b)) for (t, p), b in batches.items()],
    )
    return _frame(ApiKey.PRODUCE, 9, body), batches


def test_mixed_produce_goes_on_without_the_refused_topic() -> None:
    frame, batches = _produce(acks=-1)
    header = parse_request_header(frame)
    verdict = CHECK.refusal(CLIENT, frame, header)
    assert isinstance(verdict, Narrow) and verdict.frame is not None and verdict.merge
    assert verdict.frame[4 : header.body_offset] == frame[4 : header.body_offset]  # same header
    kept = parse_produce_request(verdict.frame, header.body_offset, 9)
    assert (kept.acks, kept.timeout_ms) == (-1, 1000)
    # The allowed batches, byte for byte, in the client's order.
    assert [(b.topic, b.partition, bytes(b.records or b"")) for b in kept.partitions] == [
        (t, p, batches[(t, p)]) for t, p in SENT if t != "payments"
    ]
    # The broker answers the allowed partitions (in its own order); the client gets all five.
    answer = ProduceResponseData(
        tuple(
            PartitionResult(t, p, 0, base_offset=10 * p)
            for t, p in reversed(SENT)
            if t != "payments"
        ),
        throttle_time_ms=3,
    )
    head = encode_response_header(ApiKey.PRODUCE, 9, 7)
    merged = verdict.merge(build_frame(head, encode_produce_response(9, answer)))
    offset = parse_response_header(merged, ApiKey.PRODUCE, 9).body_offset
    got = parse_produce_response(merged, offset, 9)
    refused = ErrorCode.topic_authorization_failed
    results = [(r.topic, r.partition, r.error_code, r.base_offset) for r in got.partitions]
    # Grouped by topic as the request named them (payments, orders.eu, audit), partitions in
    # its order.
    assert results == [
        ("payments", 0, refused, -1),
        ("payments", 1, refused, -1),
        ("orders.eu", 1, 0, 10),
        ("orders.eu", 0, 0, 0),
        ("audit", 2, 0, 20),
    ]
    assert got.throttle_time_ms == 3


def test_refused_acks0_produce_closes_after_forwarding_the_rest() -> None:
    frame, _ = _produce(acks=0)
    header = parse_request_header(frame)
    verdict = CHECK.refusal(CLIENT, frame, header)
    assert isinstance(verdict, Narrow) and verdict.merge is None and verdict.frame is not None
    assert verdict.close is not None and "acks=0" in verdict.close and "payments" in verdict.close
    kept = parse_produce_request(verdict.frame, header.body_offset, 9)
    assert {b.topic for b in kept.partitions} == {"orders.eu", "audit"}


def _fetch_v12(topics: dict[str, list[int]]) -> bytes:
    """A Fetch v12 request frame reading `topics` (name: partitions) from offset 0."""

    def partition(p: int) -> dict[str, Any]:
        offsets = {"fetch_offset": 0, "log_start_offset": -1, "current_leader_epoch": -1}
        return {"partition": p, "partition_max_bytes": 1024, **offsets}

    session = {"session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": ""}
    limits = {"max_wait": 100, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0}
    fields = {
        "replica_id": -1,
        **limits,
        **session,
        "topics": [
            {"topic": t, "partitions": [partition(p) for p in ps]} for t, ps in topics.items()
        ],
    }
    body = messages.encode_message(messages.build_request(ApiKey.FETCH, 12, fields))
    return _frame(ApiKey.FETCH, 12, body)


def _fetch_v12_answer(topics: list[tuple[str, int]]) -> bytes:
    """The broker's Fetch v12 answer: one batch for each (topic, partition)."""

    def answered(name: str, p: int) -> dict[str, Any]:
        marks = {"high_watermark": 5, "last_stable_offset": 5, "log_start_offset": 0}
        partition = {"partition_index": p, "error_code": 0, **marks, "records": b"batch"}
        partition |= {"aborted_transactions": None, "preferred_read_replica": -1}
        return {"topic": name, "partitions": [partition]}

    fields = {"throttle_time": 0, "error_code": 0, "session_id": 0}
    responses = [answered(name, p) for name, p in topics]
    reply = messages.build(
        messages.response_class(ApiKey.FETCH, 12), fields | {"responses": responses}
    )
    head = encode_response_header(ApiKey.FETCH, 12, 7)
    return build_frame(head, messages.encode_message(reply))


def test_mixed_fetch_merges_the_refused_topic_with_empty_records() -> None:
    frame = _fetch_v12({"payments": [0, 1], "audit": [2], "orders.eu": [0]})
    header = parse_request_header(frame)
    verdict = CHECK.refusal(CLIENT, frame, header)
    assert isinstance(verdict, Narrow) and verdict.frame is not None and verdict.merge
    sent = messages.decode_request(ApiKey.FETCH, 12, verdict.frame, header.body_offset)
    assert [t.topic for t in sent.topics] == ["audit", "orders.eu"]

    merged = verdict.merge(_fetch_v12_answer([("orders.eu", 0), ("audit", 2)]))
    offset = parse_response_header(merged, ApiKey.FETCH, 12).body_offset
    got = messages.decode_response(ApiKey.FETCH, 12, merged, offset)
    seen = [
        (t.topic, [(p.partition_index, p.error_code, p.records) for p in t.partitions])
        for t in got.responses
    ]
    assert seen == [
        ("payments", [(0, 29, b""), (1, 29, b"")]),
        ("audit", [(2, 0, b"batch")]),
        ("orders.eu", [(0, 0, b"batch")]),
    ]


def test_fetch_of_refused_topics_only_is_answered_here() -> None:
    frame = _fetch_v12({"payments": [0]})
    header = parse_request_header(frame)
    answer = CHECK.refusal(CLIENT, frame, header)
    assert isinstance(answer, bytes)
    offset = parse_response_header(answer, ApiKey.FETCH, 12).body_offset
    got = messages.decode_response(ApiKey.FETCH, 12, answer, offset)
    [partition] = got.responses[0].partitions
    assert (partition.error_code, partition.records) == (29, b"")
