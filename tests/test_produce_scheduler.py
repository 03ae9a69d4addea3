"""core.produce_scheduler.ProduceScheduler in memory: placement, draining, the window, linger,
lane failure, barriers; then the simulation of tests/produce_sim.py (producers, the scheduler
and a model broker on a model clock) for the workloads the scheduler is tuned for: many
producers on a few hot partitions, closed-loop producers, and an open loop at a steady rate.
The end-to-end tests with real clients are in tests/integration/ (test_coalescing*,
test_route_order, the fault suite).
"""

from __future__ import annotations

import pytest
from produce_sim import MS, run

from kipside.proxy.core.produce_scheduler import BARRIER, Batch, ProduceScheduler, Request

SIZE = 100


def batch(
    client: str, partition: int, *, topic: str = "t", acks: int = -1, size: int = SIZE
) -> Batch:
    return Batch(client, topic, partition, size, acks, 30_000, f"{client}/{topic}-{partition}")


def scheduler(lanes: int = 4, **kwargs: float) -> ProduceScheduler:
    return ProduceScheduler(lanes=lanes, max_request_bytes=1 << 20, **kwargs)  # type: ignore[arg-type]


def pass_through(s: ProduceScheduler, batches: list[Batch], now: float = 0.0) -> Request:
    placed = s.submit(batches, now)
    assert placed.whole
    request = s.passed_through(placed, batches, now)
    s.opened(placed.lane, now)
    return request


def items(requests: list[Request]) -> list[list[object]]:
    return [[b.item for b in r.batches] for r in requests]


# Placement ----------------------------------------------------------------------------------


def test_a_request_alone_on_an_idle_lane_passes_through() -> None:
    s = scheduler()
    request = pass_through(s, [batch("p1", 0), batch("p1", 1)])
    assert request.lane == 0 and request.whole and s.in_flight(0) == 1
    assert s.ready(0.0) == []


def test_a_producers_next_batch_of_a_partition_follows_the_outstanding_one() -> None:
    s = scheduler()
    first = pass_through(s, [batch("p1", 0)])
    placed = s.submit([batch("p1", 0)], 0.001)
    assert placed == type(placed)(first.lane, False)  # queued behind it, same lane
    assert s.ready(0.001) == []  # natural batching: the lane waits for its answer
    s.answered(first, 0.002)
    [second] = s.ready(0.002)
    assert second.lane == first.lane and items([second]) == [["p1/t-0"]]


def test_other_producers_of_a_hot_partition_take_idle_lanes_in_parallel() -> None:
    s = scheduler(lanes=3)
    lanes = [pass_through(s, [batch(p, 0)]).lane for p in ("p1", "p2", "p3")]
    assert lanes == [0, 1, 2]
    # Every lane busy, the cap reached: the next producer joins the least loaded one.
    placed = s.submit([batch("p4", 0)], 0.0)
    assert not placed.whole and placed.lane in lanes


def test_a_busy_lane_is_joined_once_batches_come_faster_than_its_answers() -> None:
    # Rounds of 4 producers' batches, 0.1 ms apart; the broker answers each request in 10 ms.
    # At first answers seem quick and the batches spread over idle lanes; once the scheduler
    # has seen that an answer takes 10 ms, the later batches of a round join the first one's
    # lane, to leave in its next request, instead of taking lanes of their own.
    s = scheduler(lanes=4)
    rounds = []
    for k in range(30):
        start = k * 0.010
        lanes, in_flight = [], []
        for i in range(4):
            offered = batch(f"p{i}", i)
            placed = s.submit([offered], start + i * 0.0001)
            lanes.append(placed.lane)
            if placed.whole:
                in_flight.append(s.passed_through(placed, [offered], start))
                s.opened(placed.lane, start)
        rounds.append(lanes)
        answer_at = start + 0.0099
        while in_flight:  # every request answered 10 ms on; what waited leaves meanwhile
            s.answered(in_flight.pop(0), answer_at)
            in_flight += s.ready(answer_at)
    assert len(set(rounds[0])) == 4  # spread at first
    assert len(set(rounds[-1])) == 1  # then together


def test_acks0_batches_of_a_partition_keep_one_lane() -> None:
    s = scheduler(lanes=4)
    pass_through(s, [batch("p1", 5)])  # lane 0 busy with an acks=all batch
    lanes = {s.submit([batch(f"p{i}", 7, acks=0)], 0.0).lane for i in range(5)}
    assert len(lanes) == 1


# Draining -----------------------------------------------------------------------------------


def test_one_batch_per_partition_per_request_in_arrival_order() -> None:
    s = scheduler(lanes=1)
    first = pass_through(s, [batch("p0", 9)])
    for client, partition in [("p1", 0), ("p2", 0), ("p1", 1), ("p3", 0)]:
        s.submit([batch(client, partition)], 0.0)
    s.answered(first, 0.001)
    requests = s.ready(0.001)
    # The three batches of partition 0 leave in successive requests, pipelined.
    assert items(requests) == [["p1/t-0", "p1/t-1"], ["p2/t-0"], ["p3/t-0"]]
    assert [r.lane for r in requests] == [0, 0, 0]


def test_a_held_partition_is_not_overtaken_and_acks_values_do_not_mix() -> None:
    s = scheduler(lanes=1)
    first = pass_through(s, [batch("p0", 9)])
    s.submit([batch("p1", 0, acks=1)], 0.0)
    s.submit([batch("p2", 0)], 0.0)  # acks=all after acks=1: another request
    s.submit([batch("p3", 1)], 0.0)
    s.answered(first, 0.001)
    requests = s.ready(0.001)
    assert [r.acks for r in requests] == [1, -1]
    assert items(requests) == [["p1/t-0"], ["p2/t-0", "p3/t-1"]]


def test_the_request_size_cap_splits_requests() -> None:
    s = ProduceScheduler(lanes=1, max_request_bytes=250)
    first = pass_through(s, [batch("p0", 9)])
    for partition in range(4):
        s.submit([batch("p1", partition)], 0.0)
    s.answered(first, 0.001)
    assert items(s.ready(0.001)) == [["p1/t-0", "p1/t-1"], ["p1/t-2", "p1/t-3"]]


def test_no_more_than_the_window_in_flight_on_a_lane() -> None:
    s = scheduler(lanes=1, window=2)
    first = pass_through(s, [batch("p0", 0)])
    for client in ("p1", "p2", "p3"):
        s.submit([batch(client, 0)], 0.0)
    s.answered(first, 0.001)
    sent = s.ready(0.001)
    assert len(sent) == 2 and s.in_flight(0) == 2
    s.answered(sent[0], 0.002)
    assert s.ready(0.002) == []  # the lane is still busy: it gathers more first
    s.answered(sent[1], 0.003)
    assert items(s.ready(0.003)) == [["p3/t-0"]]


def test_linger_is_an_upper_bound_on_a_busy_lanes_wait() -> None:
    s = scheduler(lanes=1, linger=0.005)
    pass_through(s, [batch("p0", 0)], 0.0)
    s.submit([batch("p1", 1)], 0.001)
    assert s.ready(0.003) == [] and s.next_deadline() == pytest.approx(0.006)
    assert items(s.ready(0.006)) == [["p1/t-1"]]  # its 5 ms are up: it leaves, lane still busy
    assert s.next_deadline() == float("inf")


# Failures, idleness, barriers ---------------------------------------------------------------


def test_a_failed_lane_gives_back_everything_on_it_and_forgets_its_partitions() -> None:
    s = scheduler(lanes=2)
    first = pass_through(s, [batch("p1", 0)])
    s.submit([batch("p1", 0)], 0.0)
    lost = s.lane_failed(first.lane)
    assert [b.item for b in lost] == ["p1/t-0", "p1/t-0"] and s.outstanding() == 0
    assert s.submit([batch("p1", 0)], 0.1).whole  # placed afresh


def test_idle_lanes_are_closed_after_idle_close() -> None:
    s = scheduler(lanes=2, idle_close=300.0)
    first = pass_through(s, [batch("p1", 0)], 0.0)
    s.answered(first, 0.001)
    assert s.idle_lanes(100.0) == []
    assert s.idle_lanes(300.001) == [first.lane]
    assert s.idle_lanes(400.0) == []  # closed once


def test_a_barrier_leaves_after_what_was_queued_before_it_and_before_what_came_after() -> None:
    s = scheduler(lanes=1)
    first = pass_through(s, [batch("p0", 9)])
    s.submit([batch("p1", 0, acks=0)], 0.0)
    s.barrier(0, "token", 0.0)
    s.submit([batch("p2", 1, acks=0)], 0.0)
    s.answered(first, 0.001)
    requests = s.ready(0.001)
    assert [r.acks for r in requests] == [0, BARRIER, 0]
    assert items(requests) == [["p1/t-0"], ["token"], ["p2/t-1"]]
    s.sent_without_answer(requests[0])
    s.sent_without_answer(requests[1])  # the barrier's answer came
    assert s.outstanding() == 1


# Simulation ---------------------------------------------------------------------------------
# Each case runs direct (one connection per producer) and through the scheduler, on the same
# model broker, in model time (each runs in well under a second).


def test_hot_partitions_cost_no_latency_and_fewer_requests() -> None:
    # 32 producers at 40 messages/s each, all on 4 partitions, linger 5 ms.
    case = dict(producers=32, partitions=4, rate=40.0, seconds=8.0)
    direct = run("direct", **case)  # type: ignore[arg-type]
    kipside = run("kipside", lanes=4, linger=5 * MS, **case)  # type: ignore[arg-type]
    assert kipside.in_order and kipside.messages >= 0.99 * direct.messages
    assert kipside.p50_ms <= direct.p50_ms + 2.0
    assert kipside.p99_ms <= 1.5 * direct.p99_ms + 5.0
    assert kipside.broker_requests < direct.broker_requests


def test_closed_loop_producers_share_requests() -> None:
    # 32 producers, each waiting for its answer before the next message, on 64 partitions.
    case = dict(producers=32, partitions=64, rate=0.0, seconds=2.0)
    direct = run("direct", **case)  # type: ignore[arg-type]
    kipside = run("kipside", lanes=2, **case)  # type: ignore[arg-type]
    assert kipside.in_order
    assert kipside.messages >= direct.messages
    per_message = kipside.broker_requests / kipside.messages
    assert per_message * 8 <= direct.broker_requests / direct.messages


def test_an_open_loop_costs_at_most_one_round_trip_for_fewer_requests() -> None:
    # 64 producers, 1,600 messages/s in all, linger 0. More than one batch comes per round
    # trip, so a batch joins a busy lane's next request rather than an idle lane: fewer
    # requests and less broker time, for a wait of at most the answer it waits for.
    case = dict(producers=64, partitions=4, rate=25.0, seconds=8.0)
    direct = run("direct", **case)  # type: ignore[arg-type]
    kipside = run("kipside", lanes=4, **case)  # type: ignore[arg-type]
    assert kipside.in_order
    assert kipside.p99_ms <= direct.p99_ms + direct.p50_ms
    assert kipside.broker_requests * 1.2 < direct.broker_requests
    assert kipside.broker_busy * 1.2 < direct.broker_busy


@pytest.mark.parametrize("seed", range(5))
def test_every_producers_order_holds_per_partition(seed: int) -> None:
    # Mixed load: a few producers closed loop and many open loop, 2 lanes, short linger.
    for rate in (0.0, 400.0):
        outcome = run(
            "kipside",
            producers=16,
            partitions=3,
            rate=rate,
            seconds=0.5,
            lanes=2,
            linger=1 * MS,
            seed=seed,
        )
        assert outcome.messages > 100 and outcome.in_order
