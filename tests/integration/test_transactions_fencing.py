"""Fencing through kipside, end to end: a second producer with the same transactional id
fences the first through kipside -> MarkerWindowRelay -> Tansu (txn_kit.py says what the
stack simulates) exactly as it does straight against a Tansu of its own: kipside's
pre-registration and answers of its own change nothing a fenced producer sees.

Run: .venv/bin/pytest tests/integration/test_transactions_fencing.py -q -p no:cacheprovider
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import confluent_kafka as ck
import pytest
from conftest import create_topics, unique_name
from testkit.broker import start_tansu

from . import txn_kit as kit
from .txn_log import read_log, resolve

pytestmark = pytest.mark.integration


make_stack = kit.make_stack


def _error_class(exc: BaseException) -> str:
    """The client's error class: librdkafka's error name, else the exception type (and the
    Kafka error it wraps)."""
    if isinstance(exc, SystemError) and isinstance(exc.__cause__, ck.KafkaException):
        # confluent-kafka raises a fatal error from inside flush(); the delivery callback
        # that runs next turns it into "SystemError: ... returned a result with an exception
        # set", caused by the client's real error.
        exc = exc.__cause__
    if isinstance(exc, ck.KafkaException) and exc.args and isinstance(exc.args[0], ck.KafkaError):
        err = exc.args[0]
        return f"KafkaError.{err.name()}{' (fatal)' if err.fatal() else ''}"
    wrapped = re.search(r"\[Error \d+\] (\w+)", str(exc))
    name = type(exc).__name__
    return name + (f"({wrapped.group(1)})" if wrapped and wrapped.group(1) != name else "")


@dataclass
class FenceOutcome:
    errors: list[tuple[str, str]]  # (step, error class) of the fenced producer
    committed: list[bytes]
    aborted: list[bytes]
    still_open: list[bytes]


def fence_scenario(client: str, bootstrap: str, topic: str, txn_id: str) -> FenceOutcome:
    """A producer commits a transaction; a second one with the same transactional id starts
    (InitProducerId bumps the epoch); the first tries another transaction and commits; the
    second commits one."""
    first = kit.TxnClient(client, bootstrap, txn_id)
    second: kit.TxnClient | None = None
    errors: list[tuple[str, str]] = []
    try:
        first.init()
        first.produce_in_transaction(topic, [(0, b"first-committed")])
        first.commit()
        second = kit.TxnClient(client, bootstrap, txn_id)
        second.init()
        steps: list[tuple[str, Callable[[], None]]] = [
            ("produce", lambda: first.produce_in_transaction(topic, [(1, b"first-fenced")])),
            ("commit", first.commit),
        ]
        for step, action in steps:
            try:
                action()
            except Exception as exc:
                errors.append((step, _error_class(exc)))
        second.produce_in_transaction(topic, [(2, b"second-committed")])
        second.commit()
    finally:
        if second is not None:  # closed in reverse: each restores the logger it found
            second.close()
        first.close()
    logs = [resolve(read_log(bootstrap, topic, p)) for p in range(3)]
    return FenceOutcome(
        errors,
        [v for log in logs for v in log.committed],
        [v for log in logs for v in log.aborted],
        [v for log in logs for v in log.still_open],
    )


FENCING_ERRORS = {
    "confluent-kafka": "KafkaError._FENCED (fatal)",
    "kafka-python": "ProducerFencedError",
}


@pytest.mark.parametrize("client", kit.CLIENTS)
def test_fencing_matches_direct(
    client: str, make_stack: kit.StackFactory, request: pytest.FixtureRequest
) -> None:
    """A second producer with the same transactional id fences the first through kipside
    exactly as it does directly against the broker: the same error class at the same step,
    the fenced producer's record never committed, the new producer's transaction commits."""
    topic = unique_name("fence", request)
    stack = make_stack(
        kit.rules_yaml("fence-*", [kit.Output(topic)], unique_name("g"), kit.HOLD_MAX_MS)
    )
    create_topics(stack.bootstrap, [topic], 3)
    via = fence_scenario(client, stack.bootstrap, topic, unique_name("fence"))
    stack.kipside.assert_alive()
    warnings = kit.assert_no_kipside_errors(stack.kipside)
    assert not stack.relay.problems(), stack.relay.problems()

    with start_tansu() as broker:
        create_topics(broker.bootstrap, [topic], 3)
        direct = fence_scenario(client, broker.bootstrap, topic, unique_name("fence"))

    assert direct.errors, "the broker did not fence the first producer (without kipside)"
    assert direct.errors[0][1] == FENCING_ERRORS[client], direct.errors
    assert via.errors == direct.errors, f"via kipside {via.errors}, direct {direct.errors}"
    for outcome in (via, direct):
        assert outcome.committed == [b"first-committed", b"second-committed"], outcome
        assert not outcome.still_open, outcome
    assert via.aborted == direct.aborted
    print(
        f"\n[{client}] fenced producer: via kipside {via.errors}; direct {direct.errors}; "
        f"kipside warnings: {warnings}"
    )
