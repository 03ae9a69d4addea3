"""Tests for pipeline.mirror.offset_sync: the sync records' format and the translation of a
consumer group's source offsets into destination offsets.

Most cases use one mirrored log, drawn here (source offsets on top, where each copied batch
landed below):

    source  100..109  [110..111 aborted + marker]  112..119  [120 marker]  121..130
    dest    500..509                                510..517                518..527
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kipside.pipeline.mirror.offset_sync import (
    OffsetSync,
    SyncIndex,
    Translation,
    decode_sync,
    encode_sync,
    translate_all,
)

CLUSTER = "src-cluster-id"


def sync(
    first: int,
    last: int,
    dest: int,
    *,
    topic: str = "orders",
    partition: int = 3,
    cluster: str = CLUSTER,
) -> OffsetSync:
    return OffsetSync(cluster, topic, partition, first, last, f"dr.{topic}", partition, dest)


LOG = [sync(100, 109, 500), sync(112, 119, 510), sync(121, 130, 518)]


def resume_at(index: SyncIndex, offset: int) -> tuple[int, bool]:
    t = index.translate("orders", 3, offset)
    assert t is not None
    assert (t.topic, t.partition, t.source_offset) == ("orders", 3, offset)
    assert (t.dest_topic, t.dest_partition) == ("dr.orders", 3)
    return t.dest_offset, t.exact


# ---- the record format ---------------------------------------------------------------------


def test_encoded_key_and_value_are_the_documented_json() -> None:
    s = OffsetSync("c1", "orders", 3, 1200, 1299, "dr.orders", 4, 1180)
    key, value = encode_sync(s)
    assert json.loads(key) == {"cluster": "c1", "topic": "orders", "partition": 3}
    assert json.loads(value) == {
        "source_offset": 1200,
        "source_last_offset": 1299,
        "dest_topic": "dr.orders",
        "dest_partition": 4,
        "dest_offset": 1180,
    }
    # Compact and ordered, so the bytes of a key never depend on how it was built.
    assert key == b'{"cluster":"c1","partition":3,"topic":"orders"}'


def test_key_is_the_partition_only() -> None:
    # The topic is compacted per key: every sync of a source partition shares one key.
    a, _ = encode_sync(sync(0, 9, 0))
    b, _ = encode_sync(sync(10, 99, 42))
    c, _ = encode_sync(sync(0, 9, 0, partition=4))
    assert a == b
    assert a != c


@given(
    st.builds(
        OffsetSync,
        cluster=st.text(max_size=30),
        topic=st.text(min_size=1, max_size=249),
        partition=st.integers(0, 2**31 - 1),
        source_offset=st.integers(0, 2**63 - 1),
        source_last_offset=st.integers(0, 2**63 - 1),
        dest_topic=st.text(min_size=1, max_size=249),
        dest_partition=st.integers(0, 2**31 - 1),
        dest_offset=st.integers(0, 2**63 - 1),
    )
)
def test_sync_round_trip(s: OffsetSync) -> None:
    assert decode_sync(*encode_sync(s)) == s


def test_decode_rejects_a_record_that_is_not_json() -> None:
    with pytest.raises(ValueError):
        decode_sync(b"not json", b"{}")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b'{"cluster": "c", "topic": "t"}', b"{}"),
        (b"[1, 2]", b"{}"),
    ],
    ids=["missing-fields", "not-an-object"],
)
def test_decode_rejects_json_that_is_not_a_sync(key: bytes, value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_sync(key, value)


# ---- translate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "dest"),
    [
        (100, 500),  # a batch's first offset
        (105, 505),  # inside a batch: the same distance
        (109, 509),  # its last offset
        (112, 510),
        (119, 517),
        (121, 518),
        (130, 527),
    ],
)
def test_offsets_inside_batches_map_linearly(offset: int, dest: int) -> None:
    assert resume_at(SyncIndex(CLUSTER, LOG), offset) == (dest, True)


@pytest.mark.parametrize(
    ("offset", "dest"),
    [
        (110, 510),  # aborted records: resume where the next copied batch landed
        (111, 510),  # the ABORT marker
        (120, 518),  # a COMMIT marker
    ],
)
def test_offsets_in_gaps_map_to_the_next_landing(offset: int, dest: int) -> None:
    assert resume_at(SyncIndex(CLUSTER, LOG), offset) == (dest, True)


@pytest.mark.parametrize("offset", [131, 132, 10_000])
def test_offsets_past_the_last_batch_map_right_after_it(offset: int) -> None:
    # A consumer that read everything resumes after the last copied record, whatever its
    # source offset (markers and aborted records after it were never copied).
    assert resume_at(SyncIndex(CLUSTER, LOG), offset) == (528, True)


@pytest.mark.parametrize("offset", [0, 99])
def test_offsets_before_the_history_are_not_exact(offset: int) -> None:
    assert resume_at(SyncIndex(CLUSTER, LOG), offset) == (500, False)


def test_syncs_given_out_of_order_are_sorted() -> None:
    assert resume_at(SyncIndex(CLUSTER, reversed(LOG)), 115) == (513, True)


def test_unknown_partition_has_no_translation() -> None:
    index = SyncIndex(CLUSTER, LOG)
    assert index.translate("orders", 4, 100) is None
    assert index.translate("payments", 3, 100) is None
    assert index.partitions() == [("orders", 3)]


def test_syncs_of_another_cluster_are_ignored() -> None:
    other = [sync(100, 200, 9000, cluster="other"), sync(0, 50, 7000, partition=9, cluster="o")]
    index = SyncIndex(CLUSTER, [*other, *LOG])
    assert resume_at(index, 105) == (505, True)
    assert index.translate("orders", 9, 10) is None
    assert index.partitions() == [("orders", 3)]
    assert SyncIndex("nobody", LOG).partitions() == []


def test_a_batch_synced_twice_keeps_its_latest_landing() -> None:
    # A retried task copied 112..119 again; the second copy landed at 600.
    index = SyncIndex(CLUSTER, [*LOG, sync(112, 119, 600)])
    assert resume_at(index, 115) == (603, True)
    assert resume_at(index, 110) == (600, True)  # the gap before it follows too
    assert resume_at(index, 105) == (505, True)  # other batches are untouched


@st.composite
def mirrored_logs(draw: st.DrawFn) -> tuple[list[OffsetSync], dict[int, int], int, int]:
    """A source log of copied batches and skipped runs (aborted records, markers), copied in
    order to a destination: (syncs, expected destination per source offset, first source
    offset, end of the log)."""
    offset = draw(st.integers(0, 1000))
    first = offset
    dest = draw(st.integers(0, 1000))
    syncs: list[OffsetSync] = []
    expected: dict[int, int] = {}
    skipped: list[int] = []
    for copied, length in draw(
        st.lists(st.tuples(st.booleans(), st.integers(1, 20)), min_size=1, max_size=15)
    ):
        if copied:
            syncs.append(sync(offset, offset + length - 1, dest))
            for i in range(length):
                expected[offset + i] = dest + i
            for o in skipped:  # they resume at this batch's landing
                expected[o] = dest
            skipped = []
            dest += length
        else:
            skipped.extend(range(offset, offset + length))
        offset += length
    for o in skipped:  # past the last copied batch: right after it
        expected[o] = dest
    return syncs, expected, first, offset


@given(mirrored_logs())
def test_translate_any_mirrored_log(
    case: tuple[list[OffsetSync], dict[int, int], int, int],
) -> None:
    syncs, expected, first, end = case
    if not syncs:
        assert SyncIndex(CLUSTER, syncs).translate("orders", 3, first) is None
        return
    index = SyncIndex(CLUSTER, syncs)
    landed = syncs[0].source_offset
    last = syncs[-1]
    after = last.dest_offset + last.source_last_offset - last.source_offset + 1
    previous = -1
    for offset in range(first, end + 3):
        dest, exact = resume_at(index, offset)
        if offset < landed:
            # Skipped offsets before the first sync: no history, so the first landing, inexact.
            assert (dest, exact) == (syncs[0].dest_offset, False)
        else:
            assert exact
            assert dest == expected.get(offset, after)
        assert dest >= previous  # a later source offset never resumes earlier
        previous = dest


def test_translate_all_splits_done_and_missing() -> None:
    index = SyncIndex(CLUSTER, [*LOG, sync(0, 9, 40, topic="payments", partition=0)])
    committed = {("orders", 3): 105, ("payments", 0): 10, ("orders", 7): 1, ("audit", 0): 5}
    done, missing = translate_all(index, committed)
    assert done == [
        Translation("orders", 3, 105, "dr.orders", 3, 505, exact=True),
        Translation("payments", 0, 10, "dr.payments", 0, 50, exact=True),
    ]
    assert missing == [("audit", 0), ("orders", 7)]


def test_translate_all_of_nothing() -> None:
    assert translate_all(SyncIndex(CLUSTER, LOG), {}) == ([], [])
