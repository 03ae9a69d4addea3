"""--sync-groups' decisions in memory: MirrorMaker 2's rules for what is committed to a group on
the destination, and when a round is due (on a model clock)."""

from __future__ import annotations

from kipside.pipeline.mirror.group_sync import Schedule, matching, plan
from kipside.pipeline.mirror.offset_sync import OffsetSync, SyncIndex

CLUSTER = "src-cluster"


def _index() -> SyncIndex:
    # orders-0: source 0-99 landed at 0, source 100-199 at 100.
    # orders-1: source 10-19 landed at 0, 30-39 at 10 (20-29 aborted on the source).
    return SyncIndex(
        CLUSTER,
        [
            OffsetSync(CLUSTER, "orders", 0, 0, 99, "dr.orders", 0, 0),
            OffsetSync(CLUSTER, "orders", 0, 100, 199, "dr.orders", 0, 100),
            OffsetSync(CLUSTER, "orders", 1, 10, 19, "dr.orders", 1, 0),
            OffsetSync(CLUSTER, "orders", 1, 30, 39, "dr.orders", 1, 10),
        ],
    )


def test_committed_offsets_are_translated_to_the_destination() -> None:
    decided = plan(
        "billing", _index(), {("orders", 0): 150, ("orders", 1): 25}, {}, dest_active=False
    )
    # 150 is inside a copied batch; 25 is in the gap: where the next copied batch landed.
    assert decided.commits == {("dr.orders", 0): 150, ("dr.orders", 1): 10}


def test_a_destination_offset_never_moves_backwards() -> None:
    decided = plan(
        "billing",
        _index(),
        {("orders", 0): 150, ("orders", 1): 35},
        {("dr.orders", 0): 160, ("dr.orders", 1): 10},
        dest_active=False,
    )
    assert decided.commits == {("dr.orders", 1): 15}
    assert decided.behind == 1


def test_a_group_with_active_members_on_the_destination_is_never_touched() -> None:
    decided = plan("billing", _index(), {("orders", 0): 150}, {}, dest_active=True)
    assert decided.active and decided.commits == {}


def test_partitions_nothing_was_mirrored_of_are_left_out() -> None:
    decided = plan("billing", _index(), {("payments", 0): 5}, {}, dest_active=False)
    assert decided.commits == {} and decided.unmirrored == 1


def test_new_syncs_extend_the_index() -> None:
    index = SyncIndex(CLUSTER)
    assert index.translate("orders", 0, 5) is None
    index.extend([OffsetSync(CLUSTER, "orders", 0, 0, 9, "dr.orders", 0, 40)])
    index.extend([OffsetSync("other-cluster", "orders", 0, 10, 19, "x", 0, 0)])
    translated = index.translate("orders", 0, 5)
    assert translated is not None and translated.dest_offset == 45


def test_groups_match_whole_names() -> None:
    assert matching("billing|audit-.*", ["billing", "billing-2", "audit-eu", "x"]) == [
        "audit-eu",
        "billing",
    ]


def test_rounds_run_at_once_then_at_most_every_interval() -> None:
    schedule = Schedule(interval=60.0)
    now = 1000.0
    assert schedule.due(now)
    schedule.ran(now)
    assert not schedule.due(now + 59.9)
    assert schedule.due(now + 60.0)
