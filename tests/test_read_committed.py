"""Tests for protocol.read_committed: which batches of a partition a reader may see, and when.

A log is written as short tokens: "d5" a plain data batch at offset 5, "t1@5" a transactional
batch of producer 1, "c1@7" / "a1@7" its producer's COMMIT / ABORT marker. Control batches are
built by hand (tests/batches.py) so control_type is tested against Kafka's format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from batches import ABORT, COMMIT, control_batch, data_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from kipside.protocol.fetch import AbortedTransaction
from kipside.protocol.read_committed import Decided, ReadCommittedFilter, Verdict
from kipside.protocol.records import RecordBatchView

DATA, ABORTED, CONTROL = Verdict.DATA, Verdict.ABORTED, Verdict.CONTROL
_TOKEN = re.compile(r"(?:d(\d+)|([tca])(\d+)@(\d+))$")


def batch(token: str) -> RecordBatchView:
    match = _TOKEN.match(token)
    assert match, token
    plain, kind, pid, offset = match.groups()
    if plain is not None:
        raw = data_batch(base_offset=int(plain))
    elif kind == "t":
        raw = data_batch(
            base_offset=int(offset), producer_id=int(pid), producer_epoch=0, transactional=True
        )
    else:
        raw = control_batch(
            COMMIT if kind == "c" else ABORT, producer_id=int(pid), base_offset=int(offset)
        )
    return RecordBatchView.from_buffer(raw)


def log(text: str) -> list[RecordBatchView]:
    return [batch(token) for token in text.split()]


def released(decided: list[Decided]) -> list[tuple[int, Verdict]]:
    return [(d.batch.base_offset, d.verdict) for d in decided]


# ---- table --------------------------------------------------------------------------------

CASES = [
    # (log, broker's aborted list, released, waiting_for)
    ("d0 d1 d2", [], [(0, DATA), (1, DATA), (2, DATA)], {}),
    ("t1@0 t1@1 c1@2", [], [(0, DATA), (1, DATA), (2, CONTROL)], {}),
    ("t1@0 t1@1 a1@2", [], [(0, ABORTED), (1, ABORTED), (2, CONTROL)], {}),
    (
        "t1@0 d1 t2@2 a2@3 c1@4",
        [],
        [(0, DATA), (1, DATA), (2, ABORTED), (3, CONTROL), (4, CONTROL)],
        {},
    ),
    # An open transaction holds everything after it, even batches already decided.
    ("t1@0 d1 t2@2 c2@3", [], [], {1: 0}),
    ("d0 t1@1 t2@2 c2@3 d4", [], [(0, DATA)], {1: 1}),
    ("t1@0 t2@1 t1@2", [], [], {1: 0, 2: 1}),
    # A producer's consecutive transactions end one at a time.
    ("t1@0 a1@1 t1@2 c1@3", [], [(0, ABORTED), (1, CONTROL), (2, DATA), (3, CONTROL)], {}),
    ("t1@0 c1@1 t1@2", [], [(0, DATA), (1, CONTROL)], {1: 2}),
    # A marker whose transaction began before the range (or wrote nothing here).
    ("c7@0 a8@1 d2", [], [(0, CONTROL), (1, CONTROL), (2, DATA)], {}),
    # The broker's list decides aborted batches without waiting for their marker.
    ("t1@0 t1@1", [(1, 0)], [(0, ABORTED), (1, ABORTED)], {}),
    ("t1@0 t2@1 t1@2", [(1, 0)], [(0, ABORTED)], {2: 1}),
    # ... from where the aborted transaction began, and only until its marker.
    (
        "t1@0 c1@1 t1@2 a1@3 t1@4",
        [(1, 2)],
        [(0, DATA), (1, CONTROL), (2, ABORTED), (3, CONTROL)],
        {1: 4},
    ),
    (
        "t1@0 a1@1 t1@2 c1@3 t1@4 a1@5",
        [(1, 0), (1, 4)],
        [(0, ABORTED), (1, CONTROL), (2, DATA), (3, CONTROL), (4, ABORTED), (5, CONTROL)],
        {},
    ),
    # Another producer's aborted transaction changes nothing for this one.
    ("t1@0 c1@1", [(2, 0)], [(0, DATA), (1, CONTROL)], {}),
]


@pytest.mark.parametrize(
    ("text", "aborted", "expected", "waiting"), CASES, ids=[c[0] for c in CASES]
)
def test_table(
    text: str,
    aborted: list[tuple[int, int]],
    expected: list[tuple[int, Verdict]],
    waiting: dict[int, int],
) -> None:
    batches = log(text)
    rc = ReadCommittedFilter()
    rc.add_aborted(AbortedTransaction(pid, first) for pid, first in aborted)
    for b in batches:
        rc.feed(b)
    out = rc.take()
    assert released(out) == expected
    assert all(d.batch is batches[i] for i, d in enumerate(out))  # the views fed, not copies
    assert rc.waiting_for == waiting
    assert rc.undecided is bool(waiting)
    assert rc.take() == []  # taken once


def test_released_as_soon_as_the_head_is_decided() -> None:
    rc = ReadCommittedFilter()
    steps = [
        ("d0", [(0, DATA)]),
        ("t1@1", []),
        ("t2@2", []),
        ("d3", []),
        ("c2@4", []),  # producer 2 is decided, but producer 1 still holds the head
        ("a1@5", [(1, ABORTED), (2, DATA), (3, DATA), (4, CONTROL), (5, CONTROL)]),
        ("d6", [(6, DATA)]),
    ]
    for token, expected in steps:
        rc.feed(batch(token))
        assert released(rc.take()) == expected, token


def test_markers_past_the_range_decide_without_being_released() -> None:
    rc = ReadCommittedFilter()
    for b in log("d0 t1@1 t2@2 d3"):
        rc.feed(b)
    assert released(rc.take()) == [(0, DATA)]
    rc.feed_marker(batch("t1@4"))  # data past the range: nothing happens
    rc.feed_marker(batch("d5"))
    assert rc.take() == []
    assert rc.waiting_for == {1: 1, 2: 2}
    rc.feed_marker(batch("c1@6"))
    assert released(rc.take()) == [(1, DATA)]
    rc.feed_marker(batch("a2@7"))
    assert released(rc.take()) == [(2, ABORTED), (3, DATA)]
    assert not rc.undecided


def test_broker_list_given_twice_is_one_list() -> None:
    # Consecutive fetches repeat the aborted transactions their ranges overlap.
    rc = ReadCommittedFilter()
    entry = [AbortedTransaction(1, 0)]
    rc.add_aborted(entry)
    rc.feed(batch("t1@0"))
    rc.add_aborted(entry)
    for b in log("a1@1 t1@2"):
        rc.feed(b)
    assert released(rc.take()) == [(0, ABORTED), (1, CONTROL)]
    assert rc.waiting_for == {1: 2}  # the next transaction is not taken for aborted


def test_read_uncommitted_passes_every_data_batch() -> None:
    rc = ReadCommittedFilter(committed_only=False)
    rc.add_aborted([AbortedTransaction(1, 0)])
    for b in log("t1@0 t2@1 d2 a1@3"):
        rc.feed(b)
    assert released(rc.take()) == [(0, DATA), (1, DATA), (2, DATA), (3, CONTROL)]
    assert not rc.undecided


# ---- property: a random log of interleaved producers --------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    view: RecordBatchView
    kind: str  # "plain", "txn" or "marker"
    txn: int | None  # the transaction a txn batch belongs to, or a marker ends
    verdict: Verdict | None  # what it finally is; None for a transaction never ended


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[Entry], list[AbortedTransaction]]:
    """A log of plain batches and up to three producers' transactions, with its aborted list."""
    steps = draw(
        st.lists(
            st.tuples(st.sampled_from(["plain", "txn", "commit", "abort"]), st.integers(1, 3)),
            max_size=30,
        )
    )
    offset = 0
    open_txn: dict[int, int] = {}  # producer id -> its open transaction
    owner: dict[int, int] = {}  # transaction -> its producer id
    first_offset: dict[int, int] = {}  # transaction -> offset of its first batch
    outcome: dict[int, Verdict] = {}  # transaction -> DATA (committed) or ABORTED
    raw: list[tuple[bytes, str, int | None]] = []
    for action, pid in steps:
        values = tuple(b"%d" % i for i in range(draw(st.integers(1, 3), label="records")))
        if action == "plain":
            raw.append((data_batch(base_offset=offset, values=values), "plain", None))
        elif action == "txn":
            txn = open_txn.setdefault(pid, len(owner))
            owner[txn] = pid
            first_offset.setdefault(txn, offset)
            written = data_batch(
                base_offset=offset,
                producer_id=pid,
                producer_epoch=0,
                transactional=True,
                values=values,
            )
            raw.append((written, "txn", txn))
        else:
            values = (b"",)  # a marker is one record
            ended = open_txn.pop(pid, None)
            if ended is not None:
                outcome[ended] = DATA if action == "commit" else ABORTED
            marker = control_batch(
                COMMIT if action == "commit" else ABORT, producer_id=pid, base_offset=offset
            )
            raw.append((marker, "marker", ended))
        offset += len(values)
    entries = []
    for batch_bytes, role, txn_id in raw:
        verdict: Verdict | None = DATA if role == "plain" else CONTROL
        if role == "txn":
            assert txn_id is not None
            verdict = outcome.get(txn_id)
        entries.append(Entry(RecordBatchView.from_buffer(batch_bytes), role, txn_id, verdict))
    aborted = [
        AbortedTransaction(owner[ended], first_offset[ended])
        for ended, result in outcome.items()
        if result is ABORTED
    ]
    return entries, aborted


def expected_release(
    fed: list[Entry], markers_seen: set[int], listed: bool, committed_only: bool
) -> list[tuple[int, Verdict]]:
    """What must be out after `fed`: the log up to its first batch not decided yet."""
    out = []
    for e in fed:
        verdict = e.verdict
        if e.kind == "txn" and committed_only:
            known = e.txn in markers_seen or (listed and verdict is ABORTED)
            if not known:
                break
        elif e.kind == "txn":
            verdict = DATA
        assert verdict is not None
        out.append((e.view.base_offset, verdict))
    return out


@settings(deadline=None, max_examples=300)
@given(
    case=logs(),
    listed=st.booleans(),
    committed_only=st.booleans(),
    data=st.data(),
)
def test_random_log(
    case: tuple[list[Entry], list[AbortedTransaction]],
    listed: bool,
    committed_only: bool,
    data: st.DataObject,
) -> None:
    entries, aborted = case
    # Batches up to `end` are the range read; the rest is looked at for markers only.
    end = data.draw(st.integers(0, len(entries)), label="end")
    rc = ReadCommittedFilter(committed_only=committed_only)
    if listed:
        rc.add_aborted(aborted)
    out: list[Decided] = []
    seen: set[int] = set()
    for i, entry in enumerate(entries):
        if entry.kind == "marker" and entry.txn is not None:
            seen.add(entry.txn)
        if i < end:
            rc.feed(entry.view)
        else:
            rc.feed_marker(entry.view)
        out += rc.take()
        # Never anything after a batch still undecided; everything decided before it.
        fed = entries[: min(i + 1, end)]
        assert released(out) == expected_release(fed, seen, listed, committed_only)

    views = [e.view for e in entries[:end]]
    assert all(d.batch is views[i] for i, d in enumerate(out))
    readable = [d.batch.base_offset for d in out if d.verdict is DATA]
    blocked = len(out) < end
    # DATA is exactly the plain batches plus the committed ones (every data batch when
    # read_uncommitted), in log order, up to the first transaction that never ended.
    wanted = [
        e.view.base_offset
        for e in entries[: len(out)]
        if e.kind == "plain" or (e.kind == "txn" and (e.verdict is DATA or not committed_only))
    ]
    assert readable == wanted
    if blocked:
        assert committed_only
        head = entries[len(out)]
        assert head.kind == "txn" and head.verdict is None
        assert rc.undecided and head.view.producer_id in rc.waiting_for
    else:
        assert not rc.undecided


def test_a_control_batch_that_is_no_transaction_marker_decides_nothing() -> None:
    # KRaft's LEADER_CHANGE (type 2) and types a newer Kafka adds are skipped, not taken for
    # an ABORT of that producer's open transaction.
    verdicts = ReadCommittedFilter()
    verdicts.feed(batch("t1@0"))
    verdicts.feed(RecordBatchView.from_buffer(control_batch(2, producer_id=1, base_offset=1)))
    assert verdicts.take() == []
    assert verdicts.waiting_for == {1: 0}
    verdicts.feed(batch("c1@2"))
    assert released(verdicts.take()) == [(0, DATA), (1, CONTROL), (2, CONTROL)]
