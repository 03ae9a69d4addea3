"""DescribeTransactions as kipside's begin hold asks it (stages.transactions.messages): the
request it writes, and what it reads from the answer: the transactional id's last transaction
is finished (its markers written) unless the coordinator says PrepareCommit, PrepareAbort or
PrepareEpochFence; no answer at all (an error, another id) is None.
"""

from __future__ import annotations

import datetime

import pytest

from kipside.protocol import (
    ApiKey,
    blank,
    encode_message,
    field_entity,
    parse_request_header,
    response_class,
)
from kipside.protocol.headers import build_frame, encode_response_header
from kipside.protocol.messages import decode_request
from kipside.proxy.stages.transactions.messages import (
    DESCRIBE_TRANSACTIONS_VERSION,
    describe_transactions_request,
    markers_written,
)

V = DESCRIBE_TRANSACTIONS_VERSION


def answer(*states: tuple[str, str, int]) -> bytes:
    """A DescribeTransactions answer frame with (transactional id, state, error) entries."""
    cls = response_class(ApiKey.DESCRIBE_TRANSACTIONS, V)
    state_cls = field_entity(cls, "transaction_states")
    entries = tuple(
        blank(
            state_cls,
            error_code=error,
            transactional_id=txn_id,
            transaction_state=state,
            transaction_timeout=datetime.timedelta(seconds=60),
            transaction_start_time=datetime.datetime.fromtimestamp(0, datetime.UTC),
            producer_id=7,
            producer_epoch=0,
            topics=(),
        )
        for txn_id, state, error in states
    )
    message = blank(cls, throttle_time=datetime.timedelta(0), transaction_states=entries)
    head = encode_response_header(ApiKey.DESCRIBE_TRANSACTIONS, V, 1)
    return build_frame(head, encode_message(message))


def test_the_request_names_one_transactional_id() -> None:
    frame = describe_transactions_request("orders-1", "app")
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version, header.client_id) == (65, V, "app")
    request = decode_request(65, V, frame, header.body_offset)
    assert request.transactional_ids == ("orders-1",)


@pytest.mark.parametrize(
    ("state", "written"),
    [
        ("PrepareCommit", False),
        ("PrepareAbort", False),
        ("PrepareEpochFence", False),
        ("CompleteCommit", True),
        ("CompleteAbort", True),
        ("Empty", True),
        ("Ongoing", True),
        ("Dead", True),
    ],
)
def test_markers_are_written_unless_the_coordinator_is_preparing(state: str, written: bool) -> None:
    assert markers_written(answer(("orders-1", state, 0)), "orders-1") is written


def test_no_state_for_the_id_is_no_answer() -> None:
    assert markers_written(answer(("orders-1", "", 53)), "orders-1") is None  # not authorized
    assert markers_written(answer(("orders-2", "CompleteCommit", 0)), "orders-1") is None
    assert markers_written(answer(), "orders-1") is None
