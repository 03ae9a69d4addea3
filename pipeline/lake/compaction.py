"""How big the lake's data files are: which files `kipside lake compact` rewrites, and into
how many files, decided on plain lists of files and sizes.

A table partition is *closed* once its day is over: the records table's partitions are
(topic, date), so a partition is closed when its date is before the cut-off (the current UTC
day, or `--before`). The quarantine table is partitioned by topic only, so there a file counts
as closed when its newest row's day (its `kafka_timestamp` upper bound) is before the cut-off.
Closed partitions can still receive a late record now and then; that is why a plan names the
exact files it replaces, never "everything in the partition".

In a closed partition, a file is *small* below three quarters of the target size. Two or more
small files of a partition are rewritten together into `round(total / target)` files (at least
one), the small files dealt out largest first to the lightest output, so each output is about
the target size. A file on its own is never rewritten: there is nothing to gain.

The writers' side of file sizes is here too: how many rows a writer that measures its file
puts in next (the executors' Iceberg writer), and how many rows a file gets from a writer that
can only count rows (Spark's, for plain Parquet).

Plain data, no I/O: the Iceberg shell (pipeline.lake.compact) lists the files, reads and writes
them, and commits the plan in one snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "SMALL_FRACTION",
    "CompactionPlan",
    "FileEntry",
    "Rewrite",
    "RowsPerFile",
    "plan_compaction",
    "rows_to_target",
]

SMALL_FRACTION: Final = 0.75  # a file below this share of the target size is small


@dataclass(frozen=True)
class FileEntry:
    """One data file of a table, as the plan sees it."""

    path: str
    size: int  # bytes on storage
    rows: int
    partition: tuple[str, ...]  # the table partition's values: (topic, date) or (topic,)
    day: str | None  # the UTC day (YYYY-MM-DD) its rows belong to, at latest; None: unknown


@dataclass(frozen=True)
class Rewrite:
    """Files of one partition that become one file."""

    partition: tuple[str, ...]
    inputs: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.inputs)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.inputs)


@dataclass(frozen=True)
class CompactionPlan:
    rewrites: tuple[Rewrite, ...]

    @property
    def inputs(self) -> list[FileEntry]:
        return [f for r in self.rewrites for f in r.inputs]

    @property
    def partitions(self) -> int:
        return len({r.partition for r in self.rewrites})

    def __bool__(self) -> bool:
        return bool(self.rewrites)


def is_closed(entry: FileEntry, before: str) -> bool:
    return entry.day is not None and entry.day < before


def plan_compaction(files: Iterable[FileEntry], *, before: str, target: int) -> CompactionPlan:
    """The rewrites that bring the closed partitions' small files (days before `before`,
    YYYY-MM-DD) to about `target` bytes a file."""
    if target <= 0:
        raise ValueError(f"target file size must be positive, not {target}")
    small: dict[tuple[str, ...], list[FileEntry]] = {}
    for entry in files:
        if is_closed(entry, before) and entry.size < target * SMALL_FRACTION:
            small.setdefault(entry.partition, []).append(entry)
    rewrites: list[Rewrite] = []
    for partition in sorted(small):
        candidates = small[partition]
        if len(candidates) < 2:
            continue
        total = sum(f.size for f in candidates)
        outputs = max(1, round(total / target))
        bins: list[list[FileEntry]] = [[] for _ in range(outputs)]
        loads = [0] * outputs
        for entry in sorted(candidates, key=lambda f: (-f.size, f.path)):
            lightest = loads.index(min(loads))
            bins[lightest].append(entry)
            loads[lightest] += entry.size
        for group in bins:
            if len(group) >= 2:
                rewrites.append(Rewrite(partition, tuple(sorted(group, key=lambda f: f.path))))
    return CompactionPlan(tuple(rewrites))


# Cutting files while writing -------------------------------------------------------------


def rows_to_target(size: int, rows: int, target: int, available: int, incoming: int) -> int:
    """How many of `available` rows (`incoming` bytes in Arrow) to write next into a file that
    holds `rows` rows in `size` bytes so far, to reach about `target` bytes (at least one).
    Before anything is written, the Arrow size stands in for the file's (Parquet encodes and
    compresses, so a file grows by less); after, the file's own bytes per row say."""
    if rows == 0 or size <= 0:
        if incoming <= 0:
            return available
        return max(1, min(available, target * available // incoming))
    left = max(target - size, 0)
    return max(1, min(available, -(-left * rows // size)))


@dataclass
class RowsPerFile:
    """Rows per file for a writer that can only cut by rows (Spark's maxRecordsPerFile): the
    target size over the bytes per row of the files written so far, at most `limit`; `limit`
    until a file has been seen."""

    target: int
    limit: int
    rows: int = 0
    bytes: int = 0

    def observe(self, rows: int, size: int) -> None:
        if rows > 0 and size > 0:
            self.rows += rows
            self.bytes += size

    def __call__(self) -> int:
        if self.rows == 0:
            return self.limit
        return max(1, min(self.limit, self.target * self.rows // self.bytes))
