"""stages.coalescing.Coalescer.plan: which ProduceRequests coalesce under the rules, in memory."""

from __future__ import annotations

import pytest
from batches import data_batch

from kipside.protocol import (
    ApiKey,
    PartitionBatch,
    build_frame,
    encode_produce_request,
    encode_request_header,
    parse_request_header,
)
from kipside.proxy.stages.coalescing import Coalescer
from kipside.rules import RuleSet, parse_rules


def produce(topic: str, acks: int = -1, version: int = 9) -> bytes:
    records = memoryview(data_batch(base_offset=0))
    header = encode_request_header(ApiKey.PRODUCE, version, 1, "tests")
    body = encode_produce_request(
        version, acks=acks, timeout_ms=1000, partitions=[PartitionBatch(topic, 0, records)]
    )
    return build_frame(header, b"".join(bytes(chunk) for chunk in body))


def plan(rules: RuleSet, frame: bytes) -> tuple[bool, int]:
    coalescer = Coalescer(None, None)  # type: ignore[arg-type]  # plan needs neither
    found = coalescer.plan(frame, parse_request_header(frame), "tests", rules)
    return found.coalesce, found.acks


@pytest.mark.parametrize(
    ("rules", "coalesced", "alone"),
    [
        ("coalescing: {enabled: true}\n", True, True),
        ("coalescing: {enabled: false}\n", False, False),
        # A matching rule decides on its own, even with coalescing switched off.
        (
            "coalescing:\n  enabled: false\n  rules:\n    - {topic: hot, coalesce: true}\n",
            True,
            False,
        ),
        (
            "coalescing:\n  enabled: true\n  rules:\n    - {topic: cold, coalesce: false}\n",
            True,
            False,
        ),
    ],
)
def test_the_first_matching_rule_decides_else_enabled(
    rules: str, coalesced: bool, alone: bool
) -> None:
    ruled = parse_rules(rules, "r.yaml")
    assert plan(ruled, produce("hot"))[0] is coalesced
    assert plan(ruled, produce("cold"))[0] is alone


def test_a_request_that_goes_on_its_own_connection_still_has_its_acks_read() -> None:
    ruled = parse_rules("coalescing:\n  rules:\n    - {topic: cold, coalesce: false}\n", "r.yaml")
    assert plan(ruled, produce("cold", acks=0)) == (False, 0)
