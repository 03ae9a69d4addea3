"""The columnar stage in memory: ProduceRequests to columnar topics leave with carriers, Fetch
answers come back with the producers' batches, and what can't be converted is passed on or
refused as the rule says. No socket, no trio: the pipeline's decisions, the work the driver runs
off the event loop, and the frames that come out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from batches import control_batch
from columnar_kit import SCHEMA, SCHEMA_DOC, ClientBatch, ClientRecord, read_back, with_base_offset
from test_fetch import partition, response_body, response_frame
from test_pipeline import client_request

from kipside.protocol import (
    ApiKey,
    ColumnarEncoder,
    ColumnarKeys,
    ColumnarOptions,
    Encoded,
    ErrorCode,
    FetchPartition,
    PartitionBatch,
    PartitionResult,
    ProduceResponseData,
    build_frame,
    columnar_version,
    encode_fetch_request,
    encode_produce_request,
    encode_produce_response,
    encode_request_header,
    iter_batches,
    parse_fetch_response,
    parse_produce_request,
    parse_produce_response,
    parse_request_header,
    parse_response_header,
    reencode_columnar_batch,
)
from kipside.protocol import response_frame as answer_frame
from kipside.proxy.core.decisions import (
    FORWARD_OWN,
    Answer,
    ClientRequest,
    Close,
    Convert,
    Decision,
    Narrow,
    Pipeline,
)
from kipside.proxy.stages.columnar import ColumnarStage
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet, parse_rules

KEY = "write_key: k1\nkeys:\n  k1: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA_DOC))
    (tmp_path / "k.yaml").write_text(KEY)
    text = """
topics:
  - topic: plain
  - topic: kept
    columnar: {schema: s.json, min_records: 10}
  - topic: strict
    columnar: {schema: s.json, min_records: 10, misfits: refuse}
  - topic: secret
    columnar: {schema: s.json, encrypt: {columns: [name], key_file: k.yaml}}
  - topic: nokey
    columnar: {schema: s.json}
"""
    return parse_rules(text, str(tmp_path / "rules.yaml"))


def own(request: ClientRequest) -> Decision:
    return FORWARD_OWN


def batch(count: int, first: int = 0, *, misfit: int | None = None, **kw: Any) -> bytes:
    records = tuple(
        ClientRecord(
            b"k%d" % i,
            b'{"id": "seven"}'
            if i == misfit
            else json.dumps({"id": i, "name": f"n{i}"}, separators=(",", ":")).encode(),
            (("h", b"%d" % i),),
            timestamp_delta=i,
        )
        for i in range(first, first + count)
    )
    return ClientBatch(records, codec="zstd", **kw).build()


def produce_frame(version: int, partitions: list[tuple[str, int, bytes]], acks: int = -1) -> bytes:
    body = encode_produce_request(
        version,
        acks=acks,
        timeout_ms=30_000,
        partitions=[PartitionBatch(t, p, memoryview(b)) for t, p, b in partitions],
    )
    header = encode_request_header(ApiKey.PRODUCE, version, 7, "test")
    return build_frame(header, b"".join(bytes(c) for c in body))


def decided(pipeline: Pipeline, frame: bytes) -> tuple[Decision, ClientRequest]:
    """The pipeline's decision, after the work a Convert asks for (as the driver runs it)."""
    decision, request = pipeline.decide(client_request(frame))
    if type(decision) is Convert:
        decision, request = pipeline.resume(decision, decision.work(), request)
    return decision, request


def sent(request: ClientRequest) -> dict[tuple[str, int], bytes]:
    header = parse_request_header(request.frame)
    produce = parse_produce_request(request.frame, header.body_offset, header.api_version)
    return {(b.topic, b.partition): bytes(b.records or b"") for b in produce.partitions}


@pytest.mark.parametrize("version", [3, 9, 11])
def test_batches_of_columnar_topics_leave_as_carriers(rules: RuleSet, version: int) -> None:
    stats = Stats()
    pipeline = Pipeline((ColumnarStage(lambda: rules, stats), own))
    big = batch(30, producer="idempotent")
    small = batch(9)
    frame = produce_frame(version, [("kept", 0, big), ("kept", 1, small), ("plain", 0, big)])
    decision, request = decided(pipeline, frame)
    assert decision is FORWARD_OWN
    out = sent(request)
    assert columnar_version(out["kept", 0]) == 1
    assert read_back(out["kept", 0]) != read_back(big)  # the records hold a segment now
    assert read_back(reencode_columnar_batch(out["kept", 0])) == read_back(big)
    assert out["kept", 1] == small and out["plain", 0] == big  # byte for byte
    assert request.header == parse_request_header(frame)
    broker = ProduceResponseData(tuple(PartitionResult(t, p, 0) for t, p in out))
    answer = answer_frame(request.header, encode_produce_response(version, broker))
    assert request.merge is not None and request.merge(answer) == answer  # as the broker gave it
    tally = stats.columnar.snapshot()
    assert dict(tally.batches) == {("produce", "converted"): 1, ("produce", "small"): 1}
    assert tally.records["produce"] == 30 and tally.ordinary_bytes["produce"] == len(big)


def test_a_request_with_nothing_to_convert_is_not_touched(rules: RuleSet) -> None:
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    frame = produce_frame(9, [("plain", 0, batch(30)), ("kept", 0, batch(3))])
    decision, request = pipeline.decide(client_request(frame))
    assert decision is FORWARD_OWN and request.frame == frame  # decided at once, no Convert


def test_misfits_go_on_unchanged_or_are_refused_as_the_rule_says(rules: RuleSet) -> None:
    stats = Stats()
    pipeline = Pipeline((ColumnarStage(lambda: rules, stats), own))
    misfit = batch(20, misfit=4)
    good = batch(20)
    order = [("kept", 0, misfit), ("strict", 0, misfit), ("strict", 1, good)]
    decision, request = decided(pipeline, produce_frame(9, order))
    assert decision is FORWARD_OWN
    out = sent(request)
    assert list(out) == [("kept", 0), ("strict", 1)]  # the refused one never leaves
    assert out["kept", 0] == misfit and columnar_version(out["strict", 1]) == 1
    # The broker answers what it got; the client gets every partition, in its order.
    broker = ProduceResponseData(
        (PartitionResult("kept", 0, 0, base_offset=10), PartitionResult("strict", 1, 0))
    )
    request_header = parse_request_header(request.frame)
    assert request.merge is not None
    merged = request.merge(answer_frame(request_header, encode_produce_response(9, broker)))
    head = parse_response_header(merged, ApiKey.PRODUCE, 9)
    got = parse_produce_response(merged, head.body_offset, 9).partitions
    assert [(r.topic, r.partition, r.error_code) for r in got] == [
        ("kept", 0, 0),
        ("strict", 0, ErrorCode.invalid_record),
        ("strict", 1, 0),
    ]
    assert got[1].record_errors == ((4, got[1].record_errors[0][1]),)
    assert "topic strict is columnar" in (got[1].error_message or "")
    assert dict(stats.columnar.snapshot().batches) == {
        ("produce", "misfit"): 1,
        ("produce", "refused"): 1,
        ("produce", "converted"): 1,
    }


def test_a_request_refused_whole_is_answered_or_closed_for_acks_0(rules: RuleSet) -> None:
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    only_misfits = [("strict", 0, batch(20, misfit=0)), ("secret", 3, batch(2, misfit=1))]
    decision, _ = decided(pipeline, produce_frame(9, only_misfits))
    assert isinstance(decision, Answer)
    head = parse_response_header(decision.frame, ApiKey.PRODUCE, 9)
    got = parse_produce_response(decision.frame, head.body_offset, 9).partitions
    assert [(r.topic, r.partition, r.error_code) for r in got] == [
        ("strict", 0, ErrorCode.invalid_record),
        ("secret", 3, ErrorCode.invalid_record),
    ]
    decision, _ = decided(pipeline, produce_frame(9, only_misfits, acks=0))
    assert isinstance(decision, Close) and "acks=0" in decision.reason


def test_an_encrypted_topic_takes_even_one_record_and_refuses_what_it_cant_encrypt(
    rules: RuleSet,
) -> None:
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    decision, request = decided(pipeline, produce_frame(9, [("secret", 0, batch(1))]))
    assert decision is FORWARD_OWN and columnar_version(sent(request)["secret", 0]) == 1


# ---- Fetch ------------------------------------------------------------------------------


def fetch_request(version: int, max_bytes: int = 50 << 20) -> bytes:
    body = encode_fetch_request(
        version,
        [FetchPartition("kept", 0, 0, 1 << 20)],
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
    )
    return build_frame(encode_request_header(ApiKey.FETCH, version, 8, "test"), body)


def carrier(count: int, base_offset: int, options: ColumnarOptions | None = None) -> bytes:
    result = ColumnarEncoder(SCHEMA, options).encode(batch(count, base_offset))
    assert isinstance(result, Encoded)
    return with_base_offset(result.batch, base_offset)


def converted(rules: RuleSet, request: bytes, answer: bytes, stats: Stats) -> bytes:
    pipeline = Pipeline((ColumnarStage(lambda: rules, stats), own))
    decision, narrowed = pipeline.decide(client_request(request))
    assert decision is FORWARD_OWN and narrowed.frame == request
    assert narrowed.convert is not None
    work = narrowed.convert(answer)
    return answer if work is None else work()


def batches_of(answer: bytes, version: int) -> list[list[bytes]]:
    head = parse_response_header(answer, ApiKey.FETCH, version)
    data = parse_fetch_response(answer, head.body_offset, version)
    return [
        [bytes(b.raw) for b in iter_batches(p.records, allow_partial_tail=True)]
        for p in data.partitions
    ]


@pytest.mark.parametrize("version", [4, 11, 12])
def test_carriers_in_an_answer_become_the_producers_batches(rules: RuleSet, version: int) -> None:
    first, second = carrier(20, 0), batch(5, 20)
    second = with_base_offset(second, 20)
    marker = control_batch(0, producer_id=4242, base_offset=25)
    cut = carrier(20, 26)[:-10]  # the broker's last batch, cut at max bytes
    records = first + second + marker + cut
    other = carrier(20, 0)
    topics = [("kept", [partition(0, records=records)]), ("plain", [partition(0, records=other)])]
    answer = response_frame(version, response_body(version, topics))[0]
    stats = Stats()
    out = converted(rules, fetch_request(version), answer, stats)
    (kept, plain) = batches_of(out, version)
    assert columnar_version(kept[0]) is None
    assert read_back(kept[0]) == read_back(with_base_offset(batch(20, 0), 0))
    assert kept[1:] == [second, marker]  # ordinary and control batches as they came
    head = parse_response_header(out, ApiKey.FETCH, version)
    (kept_data, _) = parse_fetch_response(out, head.body_offset, version).partitions
    assert bytes(kept_data.records).endswith(cut)  # the cut batch too
    assert plain == [other]  # a topic without a columnar rule: its carriers go as they are
    tally = stats.columnar.snapshot()
    assert dict(tally.batches) == {("fetch", "converted"): 1} and tally.records["fetch"] == 20


def test_an_answer_without_columnar_records_needs_no_work(rules: RuleSet) -> None:
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    _, request = pipeline.decide(client_request(fetch_request(12)))
    topics = [("plain", [partition(0, records=carrier(20, 0))]), ("kept", [partition(1)])]
    assert request.convert is not None
    assert request.convert(response_frame(12, response_body(12, topics))[0]) is None


def test_an_answer_stays_near_the_clients_max_bytes(rules: RuleSet) -> None:
    """Decoded batches are larger than carriers: past the client's max_bytes a partition's
    later batches are left for its next Fetch, and each partition keeps its first."""
    records = carrier(20, 0) + carrier(20, 20) + carrier(20, 40)
    topics = [("kept", [partition(0, records=records), partition(1, records=records)])]
    answer = response_frame(12, response_body(12, topics))[0]
    stats = Stats()
    out = converted(rules, fetch_request(12, max_bytes=100), answer, stats)
    assert [len(p) for p in batches_of(out, 12)] == [1, 1]
    assert stats.columnar.snapshot().batches["fetch", "deferred"] == 4


def test_a_carrier_that_cant_be_decoded_goes_as_it_is(rules: RuleSet) -> None:
    keys = ColumnarKeys.parse(KEY, "k.yaml")
    locked = carrier(20, 0, ColumnarOptions(encrypt=("name",), keys=keys))
    topics = [("nokey", [partition(0, records=locked)]), ("secret", [partition(0, records=locked)])]
    answer = response_frame(12, response_body(12, topics))[0]
    stats = Stats()
    nokey, secret = batches_of(converted(rules, fetch_request(12), answer, stats), 12)
    assert nokey == [locked]  # no key file in its rule: the consumer gets the carrier
    assert read_back(secret[0]) == read_back(batch(20, 0))  # its rule holds the key
    assert stats.columnar.snapshot().batches["fetch", "undecodable"] == 1


def test_fetch_versions_naming_topics_by_id_are_left_alone(rules: RuleSet) -> None:
    header = encode_request_header(ApiKey.FETCH, 13, 8, "test")
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    _, request = pipeline.decide(client_request(build_frame(header, b"\x00" * 40)))
    assert request.convert is None


def test_narrowed_twice_the_answer_goes_back_through_both_stages() -> None:
    """A later stage's merge first (its answer is to the request it saw), then the earlier's."""
    seen: list[str] = []

    def tag(name: str) -> Any:
        def merge(answer: bytes) -> bytes:
            seen.append(name)
            return answer + name.encode()

        return merge

    frame = produce_frame(9, [])
    stages = (
        lambda r: Narrow(frame, tag("first"), close="why"),
        lambda r: Narrow(frame, tag("second")),
        own,
    )
    _, request = Pipeline(stages).decide(client_request(frame))
    assert request.merge is not None and request.merge(b"") == b"secondfirst"
    assert request.close_after == "why"


def test_carriers_the_broker_refuses_are_explained_once(
    rules: RuleSet, caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka refuses a carrier on a compacted topic (its placeholders have no key): the
    producer gets the broker's answer as it is, and kipside's log says why, once per topic."""
    pipeline = Pipeline((ColumnarStage(lambda: rules, Stats()), own))
    _, request = decided(pipeline, produce_frame(9, [("kept", 0, batch(20))]))
    refused = PartitionResult(
        "kept",
        0,
        ErrorCode.invalid_record,
        error_message="Compacted topic cannot accept message without key",
    )
    answer = answer_frame(
        parse_request_header(request.frame),
        encode_produce_response(9, ProduceResponseData((refused,))),
    )
    assert request.merge is not None
    assert request.merge(answer) == answer and request.merge(answer) == answer
    lines = [r.getMessage() for r in caplog.records if "refused carriers" in r.getMessage()]
    assert len(lines) == 1 and "cleanup.policy=compact" in lines[0]
