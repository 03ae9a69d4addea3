"""Tests for pipeline.source.ranges: offsets JSON, admission control and range planning, against
the semantics of Spark's Kafka source (KafkaMicroBatchStream.rateLimit and
KafkaOffsetRangeCalculator.getRanges), with hypothesis for the invariants.
"""

from __future__ import annotations

import itertools
import json
import math

from batches import data_batch
from hypothesis import assume, given
from hypothesis import strategies as st

from kipside.pipeline.kafka.offsets import bytes_per_offset
from kipside.pipeline.source.ranges import (
    OffsetRange,
    Offsets,
    byte_limit,
    decode_offsets,
    densities,
    encode_offsets,
    owns_batch,
    plan_ranges,
    rate_limit,
)

TOPICS = st.sampled_from(["orders", "payments", "a.b-c_d"])
PARTITIONS = st.tuples(TOPICS, st.integers(0, 50))


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[Offsets, Offsets]:
    """(start, latest) of a few partitions, start <= latest."""
    tps = draw(st.lists(PARTITIONS, min_size=1, max_size=8, unique=True))
    start: Offsets = {}
    latest: Offsets = {}
    for tp in tps:
        begin = draw(st.integers(0, 10**12))
        start[tp] = begin
        latest[tp] = begin + draw(st.one_of(st.integers(0, 50), st.integers(0, 10**9)))
    return start, latest


def scala_round(x: float) -> int:
    """Scala's math.round(Double): half rounds up (Python's round() rounds half to even)."""
    return math.floor(x + 0.5)


# ---- offsets JSON --------------------------------------------------------------------------


def test_encode_offsets_shape() -> None:
    encoded = encode_offsets({("b", 1): 7, ("a", 10): 3, ("a", 2): -2})
    assert encoded == {"a": {"2": -2, "10": 3}, "b": {"1": 7}}
    # Spark keeps it as JSON text in the checkpoint: partition numbers are JSON keys, strings.
    assert json.loads(json.dumps(encoded)) == encoded


def test_decode_offsets_from_text_and_dict() -> None:
    text = '{"orders": {"0": 5, "12": 0}, "p": {"3": -1}}'
    expected = {("orders", 0): 5, ("orders", 12): 0, ("p", 3): -1}
    assert decode_offsets(text) == expected
    assert decode_offsets(json.loads(text)) == expected


@given(st.dictionaries(PARTITIONS, st.integers(-2, 2**63 - 1), max_size=20))
def test_offsets_round_trip_through_json(offsets: Offsets) -> None:
    text = json.dumps(encode_offsets(offsets))
    assert all(isinstance(p, str) for parts in json.loads(text).values() for p in parts)
    assert decode_offsets(text) == offsets
    assert decode_offsets(encode_offsets(offsets)) == offsets


# ---- rate_limit: maxOffsetsPerTrigger ------------------------------------------------------


def test_rate_limit_everything_fits() -> None:
    start = {("t", 0): 0, ("t", 1): 10}
    latest = {("t", 0): 40, ("t", 1): 70}
    assert rate_limit(start, latest, 100) == latest
    assert rate_limit(start, latest, 1000) == latest


def test_rate_limit_shares_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 1000}
    latest = {("t", 0): 300, ("t", 1): 1100}
    # Backlogs 300 and 100 share 100 offsets 3:1.
    assert rate_limit(start, latest, 100) == {("t", 0): 75, ("t", 1): 1025}


def test_rate_limit_rounds_a_share_down() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    latest = {("t", 0): 100, ("t", 1): 100, ("t", 2): 100}
    # 10 / 3 = 3.33 each: floor, so 9 in all (Spark's proration).
    assert rate_limit(start, latest, 10) == {("t", 0): 3, ("t", 1): 3, ("t", 2): 3}


def test_rate_limit_never_starves_a_small_partition() -> None:
    start = {("big", 0): 0, ("small", 0): 50}
    latest = {("big", 0): 1_000_000, ("small", 0): 52}
    end = rate_limit(start, latest, 1000)
    # The small partition's share is 0.002 offsets: it still reads one.
    assert end[("small", 0)] == 51
    assert end[("big", 0)] == 999


def test_rate_limit_partitions_without_backlog_stay_at_latest() -> None:
    start = {("t", 0): 0, ("t", 1): 5}
    latest = {("t", 0): 1000, ("t", 1): 5}
    assert rate_limit(start, latest, 10) == {("t", 0): 10, ("t", 1): 5}


@given(backlogs(), st.integers(1, 10**6))
def test_rate_limit_invariants(backlog: tuple[Offsets, Offsets], limit: int) -> None:
    start, latest = backlog
    end = rate_limit(start, latest, limit)
    assert end.keys() == latest.keys()
    total = sum(latest[tp] - start[tp] for tp in latest)
    read = sum(end[tp] - start[tp] for tp in end)
    for tp in latest:
        assert start[tp] <= end[tp] <= latest[tp]  # never backwards, never past latest
        if latest[tp] > start[tp]:
            assert end[tp] > start[tp]  # every partition with a backlog moves
    if total <= limit:
        assert end == latest
    else:
        assert read <= limit + len(latest)
        for tp in latest:
            share = limit * (latest[tp] - start[tp]) / total
            if share >= 1:
                assert end[tp] - start[tp] == math.floor(share)


# ---- byte_limit: maxBytesPerTrigger --------------------------------------------------------


def test_densities_average_the_samples_of_a_partition() -> None:
    samples: dict[tuple[str, int], list[float | None]] = {
        ("t", 0): [100.0, None, 300.0],
        ("t", 1): [50.0],
    }
    assert densities(samples, [("t", 0), ("t", 1)]) == {("t", 0): 200.0, ("t", 1): 50.0}


def test_a_partition_without_samples_is_planned_like_the_others_not_at_one_byte() -> None:
    samples: dict[tuple[str, int], list[float | None]] = {
        ("t", 0): [100.0],
        ("t", 1): [300.0],
        ("t", 2): [None],
    }
    assert densities(samples, [("t", 0), ("t", 1), ("t", 2), ("t", 3)]) == {
        ("t", 0): 100.0,
        ("t", 1): 300.0,
        ("t", 2): 200.0,
        ("t", 3): 200.0,
    }


def test_batch_headers_give_bytes_per_offset_even_when_the_last_is_cut() -> None:
    first = data_batch(base_offset=10, values=(b"a" * 100, b"b" * 100))
    second = data_batch(base_offset=12, values=(b"c" * 400,) * 4)
    records = memoryview(first + second[: len(second) // 2])  # the broker cut the second
    assert bytes_per_offset(records, 10) == (len(first) + len(second)) / 6
    assert bytes_per_offset(records, 12) == len(second) / 4  # the batch holding the offset on
    assert bytes_per_offset(memoryview(b""), 0) is None


def test_byte_limit_everything_fits() -> None:
    start = {("t", 0): 0}
    latest = {("t", 0): 100}
    assert byte_limit(start, latest, 10_000, {("t", 0): 100.0}) == latest


def test_byte_limit_shares_bytes_not_offsets() -> None:
    start = {("big", 0): 0, ("small", 0): 0}
    latest = {("big", 0): 1000, ("small", 0): 1000}
    # Same offsets behind, but "big" holds 9 times the bytes: it gets 90% of the bytes, which
    # is the same number of offsets as "small" gets with its 10%.
    per_offset = {("big", 0): 900.0, ("small", 0): 100.0}
    end = byte_limit(start, latest, 100_000, per_offset)
    assert end == {("big", 0): 100, ("small", 0): 100}


def test_byte_limit_unknown_density_counts_one_byte_per_offset() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 1000, ("t", 1): 1000}
    assert byte_limit(start, latest, 100, {}) == rate_limit(start, latest, 100)


def test_byte_limit_never_starves_a_small_partition() -> None:
    start = {("big", 0): 0, ("small", 0): 0}
    latest = {("big", 0): 10_000, ("small", 0): 1}
    per_offset = {("big", 0): 1000.0, ("small", 0): 10.0}
    end = byte_limit(start, latest, 1000, per_offset)
    assert end[("small", 0)] == 1
    assert end[("big", 0)] == 1  # 999.999 bytes' share of 1000-byte offsets: one, not zero


@given(
    backlogs(),
    st.integers(1, 10**9),
    st.lists(st.floats(0.01, 1e6), min_size=8, max_size=8),
)
def test_byte_limit_invariants(
    backlog: tuple[Offsets, Offsets], limit: int, densities: list[float]
) -> None:
    start, latest = backlog
    per_offset = dict(zip(sorted(latest), densities, strict=False))
    end = byte_limit(start, latest, limit, per_offset)
    assert end.keys() == latest.keys()
    total = sum((latest[tp] - start[tp]) * per_offset[tp] for tp in latest)
    for tp in latest:
        assert start[tp] <= end[tp] <= latest[tp]
        if latest[tp] > start[tp]:
            assert end[tp] > start[tp]
    if total <= limit:
        assert end == latest
    else:
        read = sum((end[tp] - start[tp]) * per_offset[tp] for tp in end)
        # Each partition overshoots its share by at most one offset (a share below one offset
        # still reads one); float rounding gets a little slack.
        overshoot = sum(per_offset[tp] for tp in latest if latest[tp] > start[tp])
        assert read <= (limit + overshoot) * (1 + 1e-9)


# ---- plan_ranges: one range per partition, split for minPartitions -------------------------


def test_plan_ranges_drops_empty_and_unknown_partitions() -> None:
    start = {("t", 0): 5, ("t", 1): 7, ("t", 2): 9, ("gone", 0): 0}
    end = {("t", 0): 10, ("t", 1): 7, ("t", 2): 3, ("new", 0): 4}
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 5, 10)]


def test_plan_ranges_enough_partitions_are_not_split() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    end = {("t", 0): 1000, ("t", 1): 10}
    expected = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10)]
    assert plan_ranges(start, end, 2) == expected
    assert plan_ranges(start, end, None) == expected


def test_plan_ranges_splits_by_size() -> None:
    # minPartitions 4 over sizes 300 and 100: 300/400*4 = 3 pieces and 100/400*4 = 1.
    start = {("t", 0): 0, ("t", 1): 0}
    end = {("t", 0): 300, ("t", 1): 100}
    assert plan_ranges(start, end, 4) == [
        OffsetRange("t", 0, 0, 100),
        OffsetRange("t", 0, 100, 200),
        OffsetRange("t", 0, 200, 300),
        OffsetRange("t", 1, 0, 100),
    ]


def test_plan_ranges_last_piece_takes_the_remainder() -> None:
    assert plan_ranges({("t", 0): 10}, {("t", 0): 20}, 3) == [
        OffsetRange("t", 0, 10, 13),
        OffsetRange("t", 0, 13, 16),
        OffsetRange("t", 0, 16, 20),
    ]


def test_plan_ranges_never_makes_empty_pieces() -> None:
    assert plan_ranges({("t", 0): 0}, {("t", 0): 2}, 5) == [
        OffsetRange("t", 0, 0, 1),
        OffsetRange("t", 0, 1, 2),
    ]


def test_plan_ranges_rounds_half_up_like_spark() -> None:
    ranges = plan_ranges({("t", 0): 0, ("t", 1): 0}, {("t", 0): 5, ("t", 1): 5}, 5)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 1),
        (0, 1, 3),
        (0, 3, 5),
        (1, 0, 1),
        (1, 1, 3),
        (1, 3, 5),
    ]


@given(backlogs(), st.one_of(st.none(), st.integers(1, 64)))
def test_plan_ranges_cover_exactly(
    backlog: tuple[Offsets, Offsets], min_partitions: int | None
) -> None:
    start, end = backlog
    ranges = plan_ranges(start, end, min_partitions)
    assert all(r.size > 0 for r in ranges)
    by_partition: dict[tuple[str, int], list[OffsetRange]] = {}
    for r in ranges:
        by_partition.setdefault((r.topic, r.partition), []).append(r)
    # Exactly the partitions with something to read, each covered from start to end in
    # contiguous pieces, in order.
    assert set(by_partition) == {tp for tp in end if end[tp] > start[tp]}
    for tp, pieces in by_partition.items():
        assert pieces[0].start == start[tp]
        assert pieces[-1].end == end[tp]
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        sizes = [p.size for p in pieces]
        assert max(sizes) - min(sizes) <= 1  # an even split
    assert ranges == sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))


@given(backlogs(), st.integers(1, 64))
def test_plan_ranges_piece_count_follows_spark(
    backlog: tuple[Offsets, Offsets], min_partitions: int
) -> None:
    start, end = backlog
    sizes = {tp: end[tp] - start[tp] for tp in end if end[tp] > start[tp]}
    ranges = plan_ranges(start, end, min_partitions)
    counts: dict[tuple[str, int], int] = {}
    for r in ranges:
        counts[(r.topic, r.partition)] = counts.get((r.topic, r.partition), 0) + 1
    if len(sizes) >= min_partitions:
        assert counts == dict.fromkeys(sizes, 1)
        return
    total = sum(sizes.values())
    for tp, size in sizes.items():
        x = size / total * min_partitions
        assume(x % 1 != 0.5)  # ties are the rounding bug above
        parts = max(scala_round(x), 1)
        assert counts[tp] == min(parts, size)


# ---- owns_batch: rows=batches --------------------------------------------------------------


def test_a_batch_belongs_to_the_range_of_its_last_offset() -> None:
    first, second = OffsetRange("t", 0, 0, 100), OffsetRange("t", 0, 100, 200)
    # Batch 95..104 is cut by the range end: the second range has its last record.
    assert not owns_batch(first, 95, 104)
    assert owns_batch(second, 95, 104)
    # A batch ending exactly on the last offset of a range stays in it.
    assert owns_batch(first, 90, 99)
    assert not owns_batch(second, 90, 99)
    # A batch starting at the next range's start belongs there.
    assert owns_batch(second, 100, 100)
    assert not owns_batch(first, 100, 100)


@st.composite
def cuts_and_batch(draw: st.DrawFn) -> tuple[list[int], int, int]:
    """Sorted cut points (a run of adjacent ranges, some maybe empty) and a batch whose last
    offset falls in the run; its base may lie before the run's start."""
    cuts = sorted(draw(st.lists(st.integers(0, 10**6), min_size=2, max_size=10)))
    assume(cuts[0] < cuts[-1])
    last = draw(st.integers(cuts[0], cuts[-1] - 1))
    base = draw(st.integers(max(last - 10_000, 0), last))
    return cuts, base, last


@given(cuts_and_batch())
def test_every_batch_has_exactly_one_owner(case: tuple[list[int], int, int]) -> None:
    cuts, base, last = case
    ranges = [OffsetRange("t", 0, a, b) for a, b in itertools.pairwise(cuts)]
    owners = [r for r in ranges if owns_batch(r, base, last)]
    assert len(owners) == 1
    assert owners[0].start <= last < owners[0].end


@given(
    st.lists(st.integers(0, 10**6), min_size=2, max_size=10).map(sorted),
    st.integers(0, 10**6),
    st.integers(0, 10_000),
)
def test_a_batch_ending_outside_the_run_has_no_owner(
    cuts: list[int], last: int, length: int
) -> None:
    assume(not cuts[0] <= last < cuts[-1])
    ranges = [OffsetRange("t", 0, a, b) for a, b in itertools.pairwise(cuts)]
    assert not any(owns_batch(r, max(last - length, 0), last) for r in ranges)
