"""Tests for protocol.kafka_errors: Kafka's own names and retriable flags (Errors.java)."""

from __future__ import annotations

import pytest

from kipside.protocol.kafka_errors import error_name, is_retriable

# (code, name, retriable) as Apache Kafka's Errors.java defines them; retriable means the
# exception extends RetriableException.
KAFKA = [
    (-1, "UNKNOWN_SERVER_ERROR", False),
    (0, "NONE", False),
    (1, "OFFSET_OUT_OF_RANGE", False),
    (2, "CORRUPT_MESSAGE", True),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True),
    (6, "NOT_LEADER_OR_FOLLOWER", True),
    (7, "REQUEST_TIMED_OUT", True),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True),
    (16, "NOT_COORDINATOR", True),
    (19, "NOT_ENOUGH_REPLICAS", True),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False),
    (49, "INVALID_PRODUCER_ID_MAPPING", False),
    (51, "CONCURRENT_TRANSACTIONS", True),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", False),
    (74, "FENCED_LEADER_EPOCH", True),
    (75, "UNKNOWN_LEADER_EPOCH", True),
    (90, "PRODUCER_FENCED", False),
]


@pytest.mark.parametrize(("code", "name", "retriable"), KAFKA, ids=[k[1] for k in KAFKA])
def test_kafka_names_and_flags(code: int, name: str, retriable: bool) -> None:
    assert error_name(code) == name
    assert is_retriable(code) is retriable


@pytest.mark.parametrize("code", [-2, 9999, 2**15 - 1])
def test_unknown_codes(code: int) -> None:
    assert error_name(code) == f"UNKNOWN_ERROR_CODE_{code}"
    assert is_retriable(code) is False
