"""The Iceberg lake's decisions in memory: the offsets a table holds (from its snapshot
summaries), which rows a micro-batch may add, the schema changes applied or refused, and one
task's rows split between the two tables. No Spark, no catalog."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kipside.pipeline.lake.evolution import SchemaChangeRefused, plan_evolution
from kipside.pipeline.lake.landing import Landing, split_batch
from kipside.pipeline.lake.ledger import (
    BATCH_KEY,
    OFFSETS_KEY,
    ConcurrentWriter,
    TableOffsets,
)

from .iceberg_kit import DATA_SCHEMA

# Ledger ---------------------------------------------------------------------------------------


def test_the_newest_snapshot_with_offsets_counts() -> None:
    summaries = [
        {"operation": "replace"},  # compaction: no offsets of its own
        {OFFSETS_KEY: '{"orders":{"0":12,"1":7}}', BATCH_KEY: "3"},
        {OFFSETS_KEY: '{"orders":{"0":5}}', BATCH_KEY: "2"},
    ]
    offsets = TableOffsets.from_summaries(summaries)
    assert offsets.next == {("orders", 0): 12, ("orders", 1): 7}
    assert TableOffsets.from_summaries([]).next == {}


def test_a_replayed_micro_batch_moves_nothing_and_keeps_no_row() -> None:
    table = TableOffsets({("orders", 0): 12, ("orders", 1): 7})
    replay = {("orders", 0): 12, ("orders", 1): 7}
    assert not table.moves(replay)
    assert not table.keeps("orders", 0, 11) and table.keeps("orders", 0, 12)
    assert table.keeps("payments", 0, 0)  # a partition the table never saw: everything
    assert table.moves({("orders", 1): 9})


def test_offsets_merge_forward_only_and_round_trip_the_summary() -> None:
    table = TableOffsets({("orders", 0): 12, ("orders", 1): 7})
    after = table.advanced({("orders", 0): 10, ("orders", 1): 9, ("payments", 0): 3})
    assert after.next == {("orders", 0): 12, ("orders", 1): 9, ("payments", 0): 3}
    summary = after.summary(42)
    assert summary[BATCH_KEY] == "42"
    assert json.loads(summary[OFFSETS_KEY]) == {"orders": {"0": 12, "1": 9}, "payments": {"0": 3}}
    assert TableOffsets.parse(summary[OFFSETS_KEY]) == after


def test_a_commit_is_refused_if_another_writer_moved_the_offsets() -> None:
    planned = TableOffsets({("orders", 0): 12})
    planned.check_unchanged(TableOffsets({("orders", 0): 12}), "kipside.lake")
    with pytest.raises(ConcurrentWriter, match="another job is ingesting into it"):
        planned.check_unchanged(TableOffsets({("orders", 0): 20}), "kipside.lake")


def test_starting_offsets_name_every_partition_read() -> None:
    table = TableOffsets({("orders", 0): 12, ("gone", 0): 4})
    starting = json.loads(table.starting_offsets([("orders", 0), ("orders", 1)]))
    assert starting == {"orders": {"0": 12, "1": -2}}


# Schema evolution -----------------------------------------------------------------------------

ITEM = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("user", pa.large_string()),
        pa.field("n", pa.int32()),
        pa.field("items", pa.large_list(pa.field("element", ITEM))),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)


def _wanted(*extra: pa.Field, drop: str = "", **changed: pa.Field) -> pa.Schema:
    fields = [changed.get(f.name, f) for f in TABLE if f.name != drop]
    return pa.schema([*fields, *extra])


def test_the_same_schema_changes_nothing_across_arrow_variants() -> None:
    same = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("user", pa.string()),
            pa.field("n", pa.int32()),
            pa.field("items", pa.list_(pa.field("item", ITEM))),
            pa.field("at", pa.timestamp("us", tz="+00:00")),
        ]
    )
    assert not plan_evolution(TABLE, same, "t").changes


def test_optional_fields_are_added_at_any_depth_and_types_widened() -> None:
    item = pa.struct([("sku", pa.string()), ("qty", pa.int64()), ("size", pa.string())])
    wanted = _wanted(
        pa.field("coupon", pa.string()),
        items=pa.field("items", pa.list_(pa.field("element", item))),
        n=pa.field("n", pa.int64()),
        id=pa.field("id", pa.int64()),
    )
    plan = plan_evolution(TABLE, wanted, "t")
    assert plan.added == ["items[].size", "coupon"]
    assert plan.widened == ["n"]
    assert plan.relaxed == ["id"]
    assert plan.describe() == "added items[].size, coupon; made optional id; widened n"


def test_unsafe_changes_are_refused_together() -> None:
    wanted = _wanted(
        pa.field("region", pa.string(), nullable=False),
        drop="at",
        user=pa.field("user", pa.string(), nullable=False),
        n=pa.field("n", pa.string()),
    )
    with pytest.raises(SchemaChangeRefused) as refused:
        plan_evolution(TABLE, wanted, "kipside.lake")
    text = str(refused.value)
    assert text.startswith("table kipside.lake: the schema file asks for changes")
    for problem in (
        "field 'at' is not in the schema file",
        "field 'user' would become required",
        "field 'n' would change type from int32 to string",
        "new field 'region' is required",
    ):
        assert problem in text


# One task's rows split between the tables -------------------------------------------------

VALUE = pa.struct([("id", pa.int64())])
UTC = dt.UTC


def _decoded(rows: list[tuple[int, int, str | None, int]]) -> pa.RecordBatch:
    """(partition, offset, error, day of November) per row; id = offset."""
    return pa.RecordBatch.from_pydict(
        {
            "_value": pa.array([{"id": o} for _, o, _, _ in rows], VALUE),
            "kafka_partition": pa.array([p for p, _, _, _ in rows], pa.int32()),
            "kafka_offset": pa.array([o for _, o, _, _ in rows], pa.int64()),
            "kafka_timestamp": pa.array(
                [dt.datetime(2026, 11, d, tzinfo=UTC) for _, _, _, d in rows],
                pa.timestamp("us", tz="UTC"),
            ),
            "topic": ["orders"] * len(rows),
            "date": pa.array([dt.date(2026, 11, d) for _, _, _, d in rows], pa.date32()),
            "key": pa.array([None] * len(rows), pa.binary()),
            "value": pa.array([b"x"] * len(rows), pa.binary()),
            "_error": pa.array([e for _, _, e, _ in rows], pa.string()),
        }
    )


def test_rows_the_tables_hold_are_dropped_and_the_rest_grouped() -> None:
    batch = _decoded(
        [
            (0, 4, None, 1),  # below the records table's offset 5: already there
            (0, 5, None, 1),
            (0, 6, "bad", 2),  # below the quarantine's offset 7: already there
            (0, 7, "bad", 2),
            (1, 0, None, 2),
        ]
    )
    landing = Landing()
    split_batch(
        batch,
        landing,
        TableOffsets({("orders", 0): 5}),
        TableOffsets({("orders", 0): 7}),
        DATA_SCHEMA,
        lambda value, hint: f"why: {hint}",
    )
    data = {key: part.to_pydict() for key, part in landing.data}
    assert sorted(data) == [("orders", dt.date(2026, 11, 1)), ("orders", dt.date(2026, 11, 2))]
    assert data[("orders", dt.date(2026, 11, 1))]["kafka_offset"] == [5]
    assert data[("orders", dt.date(2026, 11, 2))]["kafka_offset"] == [0]
    ((topic, bad),) = landing.quarantine
    assert topic == "orders" and bad.to_pydict()["kafka_offset"] == [7]
    assert bad.to_pydict()["error"] == ["why: bad"]
    assert landing.seen == {("orders", 0): 8, ("orders", 1): 1}


def test_a_task_writes_files_of_at_most_max_records_and_reports_them(tmp_path: Path) -> None:
    """write_task (the executors' side) on plain Arrow, no Spark: files under the tables' data
    locations, split at max_records_per_file, and the next offset per partition read."""
    from kipside.pipeline.lake.iceberg import Target, TaskPlan, quarantine_arrow_schema, write_task

    batch = _decoded([(0, o, "bad" if o == 3 else None, 1) for o in range(7)])
    plan = TaskPlan(
        batch_id=4,
        data=Target((tmp_path / "data").as_uri(), "{}", DATA_SCHEMA),
        quarantine=Target((tmp_path / "bad").as_uri(), "{}", quarantine_arrow_schema()),
        compression="zstd",
        max_records_per_file=4,
        target_file_size=128 << 20,
        schema_json='{"type": "struct", "fields": []}',
    )
    (result,) = list(write_task(plan, iter([batch])))
    out = result.to_pylist()
    files = [r for r in out if r["kind"] == "data"]
    assert [r["rows"] for r in files] == [4, 2]
    for r in files:
        path = Path(r["path"].removeprefix("file://"))
        assert path.parent.name == "date=2026-11-01" and path.name.startswith("b000000000004-")
        assert pq.read_table(path).num_rows == r["rows"]
    (bad,) = [r for r in out if r["kind"] == "quarantine"]
    assert bad["rows"] == 1 and "/bad/topic=orders/" in bad["path"]
    assert [
        (r["topic"], r["kafka_partition"], r["next_offset"]) for r in out if r["kind"] == "offset"
    ] == [("orders", 0, 7)]
