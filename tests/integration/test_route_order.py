"""A client's produce order holds when its requests change route.

kipside sends a ProduceRequest on the shared lanes (coalesced, or passed through) or on the
client's own broker connection, as the coalescing rules say; with a rule that excludes some
topics, a client whose requests mix topics sends some requests one way and some the other, so
one partition's batches can take both routes in turn. Two connections are two queues at the
broker: a batch on the quick route reaches it before an earlier batch of the same partition
still on the slow one, unless kipside waits. An idempotent producer then gets
OUT_OF_ORDER_SEQUENCE_NUMBER from Apache Kafka; Tansu 0.6.0 appends it out of order.

Here kafka-python (which puts every ready partition of a broker in one request, and without
idempotence pipelines up to 5 requests per connection, as the Java client does with it) produces
numbered records to a coalesced topic and, every other request, to an excluded one too, so the
coalesced topic's partition alternates between the client's own connection (mixed requests)
and the lanes (requests of it alone). A relay between kipside and Tansu makes one route slow
(SlowPathRelay: "own" delays the mixed requests, "lanes" the others) and records each
ProduceRequest the broker got. The test asserts that both kinds of request reached the broker
and that a consumer reads every record exactly once, in send order (the log's order is the
broker's arrival order). (kafka-python's idempotent producer sends one batch per partition at a
time, so it cannot show the overtaking; the order asserted here is what an idempotent producer
needs as well.)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import create_topics
from relaykit.base import Relay
from relaykit.decisions import Conn, Decision, Request
from relaykit.tansu import tansu_behind
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import scrape
from testkit.ports import free_port

from kipside.protocol.apis import ApiKey
from kipside.protocol.produce import parse_produce_request
from kipside.protocol.records import iter_batches

from .clients import FLUSH_TIMEOUT, Msg, assert_exactly_once_in_order
from .clients_kafka_python import kp_producer
from .clients_read_back import consume_assigned

pytestmark = pytest.mark.integration

COALESCED, EXCLUDED = "route-order-lane", "route-order-own"
EXCLUDING = f"""coalescing:
  enabled: true
  rules:
    - topic: "{EXCLUDED}"
      coalesce: false
"""
COALESCING_OFF = "coalescing:\n  enabled: false\n"
SLOW_MS = 150.0
ROUNDS = 8
GAP_SECONDS = 0.025
TEST_TIMEOUT = 60.0

Arrival = tuple[str, int, int]  # topic, partition, records


class SlowPathRelay(Relay):
    """Delays the ProduceRequests of one route by `slow_ms`, and records what reaches the broker.

    A connection is a client's own connection if its first request is a ProduceRequest: kipside
    dials a client's own connection for the first request the lanes don't take, and a producer's
    other requests (ApiVersions, Metadata) go to the lanes, which kipside itself opens with
    ApiVersions. slow="own" delays the ProduceRequests of own connections, slow="lanes" those of
    the others. Requests after a delayed one on its connection wait behind it, as on a slow path.
    """

    def __init__(self, slow: str, slow_ms: float) -> None:
        super().__init__()
        self.slow, self.slow_ms = slow, slow_ms
        self._own: dict[int, bool] = {}  # by connection number, from its first request
        self._requests: list[tuple[bool, list[Arrival]]] = []

    def produce_requests(self) -> list[tuple[bool, list[Arrival]]]:
        """(on an own connection?, its batches) of each ProduceRequest, in the order the broker
        received them."""
        with self._lock:
            return list(self._requests)

    def request_hold_ms(self, conn: Conn, request: Request) -> float:
        own = self._own.setdefault(conn.number, request.header.api_key == ApiKey.PRODUCE)
        if request.header.api_key != ApiKey.PRODUCE:
            return 0.0
        return self.slow_ms if own == (self.slow == "own") else 0.0

    def on_request(self, conn: Conn, request: Request) -> Decision:
        if request.header.api_key == ApiKey.PRODUCE:
            with self._lock:
                self._requests.append((self._own[conn.number], self._batches(request)))
        return super().on_request(conn, request)

    @staticmethod
    def _batches(request: Request) -> list[Arrival]:
        header = request.header
        parsed = parse_produce_request(request.frame, header.body_offset, header.api_version)
        return [
            (p.topic, p.partition, b.records_count)
            for p in parsed.partitions
            if p.records is not None
            for b in iter_batches(p.records)
        ]


class SlowPath(NamedTuple):
    relay: SlowPathRelay
    kipside: Kipside
    rules: Path
    admin_port: int


@pytest.fixture
def slow_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SlowPath]:
    """Tansu behind a SlowPathRelay (request.param: the slow route), kipside in front with the
    EXCLUDING rules and an admin port."""
    relay = SlowPathRelay(request.param, SLOW_MS)
    with tansu_behind(relay):
        rules = tmp_path / "rules.yaml"
        rules.write_text(EXCLUDING)
        admin_port = free_port()
        kipside = start_kipside(
            relay,
            tmp_path / "kipside",
            rules=rules,
            extra_args=["--admin", f"127.0.0.1:{admin_port}"],
        )
        try:
            yield SlowPath(relay, kipside, rules, admin_port)
        finally:
            assert kipside.stop() == 0


def produce_in_rounds(
    bootstrap: str,
    topics_of_round: Callable[[int], tuple[str, ...]],
    between: Callable[[int], None],
    acks: int | str = "all",
) -> dict[str, list[Msg]]:
    """kafka-python, pipelining: one request per round (the round's topics), `between` after
    each; returns what it sent, once every record is acknowledged (acks=0: sent)."""
    producer = kp_producer(
        bootstrap,
        enable_idempotence=False,
        max_in_flight_requests_per_connection=5,
        linger_ms=2,
        acks=acks,
    )
    sent: dict[str, list[Msg]] = {COALESCED: [], EXCLUDED: []}
    futures = []
    try:
        for i in range(ROUNDS * 2):
            for topic in topics_of_round(i):
                msg = Msg(0, f"k{i % 5}".encode(), f"{topic}:{i:04d}".encode())
                sent[topic].append(msg)
                futures.append(producer.send(topic, value=msg.value, key=msg.key, partition=0))
            time.sleep(GAP_SECONDS)  # past linger_ms: the sender has taken what is there
            between(i)
        producer.flush(timeout=FLUSH_TIMEOUT)
        errors = [str(f.exception) for f in futures if f.failed()]
    finally:
        producer.close(timeout=5)
    assert errors == [], f"{len(errors)} records failed: {errors[:3]}"
    return sent


def assert_in_order(path: SlowPath, sent: dict[str, list[Msg]]) -> None:
    """Every record once, in send order, and kipside made requests wait for the old route."""
    for topic, msgs in sent.items():
        if not msgs:
            continue
        got, marks = consume_assigned(path.kipside.bootstrap, topic, 1, len(msgs))
        assert_exactly_once_in_order(msgs, got, marks)
    assert scrape(path.admin_port).value("kipside_produce_route_waits_total") > 0


@pytest.mark.parametrize(
    ("slow_path", "acks"),
    [("own", "all"), ("lanes", "all"), ("own", 0), ("lanes", 0)],
    indirect=["slow_path"],
)
def test_a_partition_moving_between_own_connection_and_lanes_keeps_its_order(
    slow_path: SlowPath, acks: int | str
) -> None:
    # acks=0: nothing answers the batches on the slow route; kipside sends a request of its
    # own behind them there, and the batch changing route waits for its answer.
    relay, kipside = slow_path.relay, slow_path.kipside
    started = time.monotonic()
    create_topics(kipside.bootstrap, [COALESCED, EXCLUDED], partitions=1)
    # A mixed request (own connection), then one of the coalesced topic alone (lanes).
    sent = produce_in_rounds(
        kipside.bootstrap,
        lambda i: (COALESCED, EXCLUDED) if i % 2 == 0 else (COALESCED,),
        lambda i: None,
        acks,
    )
    assert relay.problems() == []
    routes = {(own, frozenset(t for t, *_ in batches)) for own, batches in relay.produce_requests()}
    # The coalesced topic's partition went both ways, and the relay told the routes apart.
    assert routes == {(True, frozenset({COALESCED, EXCLUDED})), (False, frozenset({COALESCED}))}
    assert_in_order(slow_path, sent)
    assert time.monotonic() - started < TEST_TIMEOUT


@pytest.mark.parametrize("slow_path", ["own"], indirect=True)
def test_a_partition_moved_by_rule_reloads_keeps_its_order(
    slow_path: SlowPath,
) -> None:
    relay, kipside, rules = slow_path.relay, slow_path.kipside, slow_path.rules
    started = time.monotonic()
    create_topics(kipside.bootstrap, [COALESCED], partitions=1)
    mark = kipside.log_mark()

    def reload(i: int) -> None:
        # Coalescing off, on, off...: the one partition moves to its own connection and back.
        rules.write_text(COALESCING_OFF if i % 2 == 0 else EXCLUDING)
        kipside.proc.send_signal(signal.SIGHUP)

    sent = produce_in_rounds(kipside.bootstrap, lambda i: (COALESCED,), reload)
    assert relay.problems() == []
    assert kipside.log_since(mark).count("rules reloaded (SIGHUP)") >= ROUNDS
    assert {own for own, _ in relay.produce_requests()} == {True, False}
    assert_in_order(slow_path, sent)
    assert time.monotonic() - started < TEST_TIMEOUT
