"""Transactions: consume-transform-produce direct vs through kipside, marker window on.

    .venv/bin/python bench/txn.py [--transactions 150] [--seconds 8] [--windows 20,50,200]
        [--rtts 0,5] [--clients confluent-kafka,kafka-python] [--paths direct,kipside] [--quick]

Tansu has no marker-writing window after EndTxn, so every run puts tests/txn_relay.py's
MarkerWindowRelay (a fault-injecting SIMULATION of Apache Kafka's coordinator) in front of a
fresh Tansu: W ms of CONCURRENT_TRANSACTIONS after each EndTxn, RTT/2 each way. kipside is a
sidecar on the client side: client -> kipside -> relay -> Tansu. One client process
(bench/_txn_load.py) per run. docs/performance.md ("Transactions") says what each measures.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from _chart import grouped
from _harness import PROXY_LOG, REPO, open_stack
from _measure import Window, percentile, repeat, run_json, wait_until_quiet
from _report import Report, Target, facts, listed, parse_args, run_notes, table
from txn_relay import ACCEPTED, END_TXN, REJECTED, MarkerWindowRelay, TxnEvent
from txn_relay import ADD_OFFSETS as ADD_O
from txn_relay import ADD_PARTITIONS as ADD_P

LOAD = REPO / "bench" / "_txn_load.py"
CLIENTS = {"confluent-kafka": "librdkafka", "kafka-python": "kafka-python"}
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--transactions": (int, 150, "most measured per run"),
    "--seconds": (float, 8.0, "most measured time per run"),
    "--windows": (listed(float), [20.0, 50.0, 200.0], "marker windows W, ms"),
    "--rtts": (listed(float), [0.0, 5.0], "client side <-> broker side RTTs, ms"),
    "--clients": (listed(str, list(CLIENTS)), list(CLIENTS), "a comma-separated subset"),
    "--paths": (listed(str, ["direct", "kipside"]), ["direct", "kipside"], "a subset"),
    "--quiet-wait": (float, 600.0, "first wait this long for quiet"),
}
QUICK = {"transactions": 10, "seconds": 2.0, "windows": [50.0], "rtts": [5.0], "quiet_wait": 1.0}
RULES = """transactions:
  - transactional_id: "bench-*"
    outputs: [{topic: bench-txn-out}]
    consumer_group: bench-txn-group
    hold_begin: {max_ms: 5000}
"""
WARMUP, DEADLINE, NOISY, NAN = 3, 105.0, 0.3, float("nan")
TARGET_SPEEDUP, TARGET_ADDS = 1.3, 2
COLUMNS = [
    ("txns", "{transactions:.0f}"),
    ("time-capped", "{time_capped:.0f}"),
    ("txn/s", "{txn_per_s:.1f}"),
    ("vs direct", "{vs_direct:.2f}x"),
    ("p50 / p99 ms", "{p50_ms:.1f} / {p99_ms:.1f}"),
    ("coord req/txn (AP+AO+EndTxn)", "{accepted:.2f} ({ap:.1f}+{ao:.1f}+{end:.1f})"),
    ("in-window CT/txn", "{rejected:.2f}"),
    ("max accepted adds/txn", "{max_adds:.0f}"),
    ("AP-AO gap p50 / max ms", "{gap_p50:.2f} / {gap_max:.2f}"),
    ("parallel (1: yes)", "{parallel:.0f}"),
    ("CT seen by client", "{client_concurrent:.0f}"),
    ("other load (cores)", "{noise_cores:.2f}"),
]


def coordinator(events: Sequence[TxnEvent], start: float, end: float) -> dict[str, float]:
    """What the relay saw of the transactions whose EndTxn it answered in [start, end]: per
    transaction, accepted and rejected adds, EndTxns, and first AP -> first AO gaps."""
    txns, current = [], list[TxnEvent]()
    for event in events:
        current.append(event)
        if event.kind == END_TXN and event.error_code == 0:
            if start <= event.at <= end:
                txns.append(current)
            current = []
    n = max(len(txns), 1)

    def count(kind: str, outcome: str | None = None) -> float:
        return sum(e.kind == kind and outcome in (None, e.outcome) for t in txns for e in t) / n

    gaps, adds = [], []
    for t in txns:
        firsts = [next((e.at for e in t if e.kind == k), None) for k in (ADD_P, ADD_O)]
        if firsts[0] is not None and firsts[1] is not None:
            gaps.append(abs(firsts[1] - firsts[0]) * 1000)
        adds.append(sum(e.kind != END_TXN and e.outcome == ACCEPTED for e in t))
    ap, ao, ends = count(ADD_P, ACCEPTED), count(ADD_O, ACCEPTED), count(END_TXN)
    return {
        "relay_txns": float(len(txns)),
        "ap": ap,
        "ao": ao,
        "end": ends,
        "accepted": ap + ao + ends,
        "rejected": count(ADD_P, REJECTED) + count(ADD_O, REJECTED),
        "max_adds": float(max(adds, default=0)),
        "gap_p50": percentile(gaps, 50),
        "gap_max": max(gaps, default=NAN),
    }


def transact(
    client: str, window: float, rtt: float, path: str, args: argparse.Namespace, logdir: Path
) -> dict[str, float]:
    """One client process's loop on a fresh relay, Tansu (and kipside), and what the relay saw."""
    relay = MarkerWindowRelay(window_ms=window, delay_ms=rtt / 2).start()
    try:
        with open_stack(path, logdir, rules=RULES, relay=relay) as stack:
            work = {"client": client, "bootstrap": stack.bootstrap, "warmup": WARMUP}
            work["transactional_id"] = f"bench-{client}"
            work |= {"transactions": args.transactions, "seconds": args.seconds}
            w = Window.of(stack)
            data = run_json(LOAD, json.dumps(work), timeout=DEADLINE, log=logdir / "load.log")
            w.close()
    finally:
        relay.close()
        with (logdir / PROXY_LOG).open("a") as log:  # noted with what kipside logged
            log.writelines(f"WARNING relay: {problem}\n" for problem in relay.problems())
    out = coordinator(relay.events(f"bench-{client}"), data["start"], data["end"])
    keys = ("transactions", "txn_per_s", "time_capped", "client_concurrent", "warmup_concurrent")
    out |= {k: float(data[k]) for k in keys}
    out["p50_ms"] = percentile(data["latencies_ms"], 50)
    out["p99_ms"] = percentile(data["latencies_ms"], 99)
    out["noise_cores"] = w.noise_cores()
    decided = rtt > 0 and out["gap_max"] == out["gap_max"]
    out["parallel"] = float(out["gap_max"] < rtt) if decided else NAN
    return out


def targets(args: argparse.Namespace, found: dict[str, dict[str, float]]) -> list[Target]:
    kip = {c: m for c, m in found.items() if c.endswith("kipside")}
    if not kip:
        return [Target("kipside targets", None, "no kipside run succeeded")]
    seen = sum(m["client_concurrent"] + m["warmup_concurrent"] for m in kip.values())
    zero = "0 CONCURRENT_TRANSACTIONS reach a client through kipside"
    out = [Target(zero, seen == 0, f"{seen:.0f} in {len(kip)} kipside runs, warm-up included")]
    worst = max(m["max_adds"] for m in kip.values())
    decided = {c: m["parallel"] for c, m in kip.items() if m["parallel"] == m["parallel"]}
    serial = [c for c, p in decided.items() if not p]
    detail = f"at most {worst:.0f} accepted adds per transaction; first AddPartitionsToTxn and "
    detail += f"AddOffsetsToTxn in flight together in {len(decided) - len(serial)} of "
    detail += f"{len(decided)} runs with RTT > 0" + (
        f"; not in: {', '.join(serial)}" if serial else ""
    )
    name = f"<= {TARGET_ADDS} coordinator round trips before EndTxn, in parallel (kipside)"
    out.append(Target(name, worst <= TARGET_ADDS and bool(decided) and not serial, detail))
    for client in args.clients:
        name = (
            f">= {TARGET_SPEEDUP}x direct transactions/s at W=50 ms, RTT=5 ms ({CLIENTS[client]})"
        )
        k = found.get(f"{client} W=50 RTT=5 kipside")
        if k is None or k["vs_direct"] != k["vs_direct"]:
            out.append(Target(name, None, "that cell was not measured, or failed"))
        else:
            out.append(Target(name, k["vs_direct"] >= TARGET_SPEEDUP, f"{k['vs_direct']:.2f}x"))
    return out


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    busy = wait_until_quiet(NOISY, args.quiet_wait)
    cases = {
        f"{c} W={w:g} RTT={r:g} {p}": partial(transact, c, w, r, p, args)
        for c in args.clients
        for r in args.rtts
        for w in args.windows
        for p in args.paths
    }
    runs = repeat(cases, 1, noisy=NOISY, budget=330)
    found = {r.case: r.metrics for r in runs if r.ok}
    for case, m in found.items():
        d = found.get(case.rsplit(" ", 1)[0] + " direct", {})
        m["vs_direct"] = m["txn_per_s"] / d["txn_per_s"] if d.get("txn_per_s") else NAN
    notes = run_notes(runs, NOISY)
    notes += [
        f"{c}: the relay saw {m['relay_txns']:.0f} EndTxn for {m['transactions']:.0f} transactions"
        for c, m in found.items()
        if m["relay_txns"] != m["transactions"]
    ]
    panels = []
    for c, r in [(c, r) for c in args.clients for r in args.rtts]:
        series = {p: [f"{c} W={w:g} RTT={r:g} {p}" for w in args.windows] for p in args.paths}
        labels = [f"W {w:g} ms" for w in args.windows]
        title = f"{CLIENTS[c]}, RTT {r:g} ms: transactions/s"
        panels.append(grouped(title, found, "txn_per_s", labels, series, "{:.1f}"))
    more = [
        f"Waited up to {args.quiet_wait:g} s for a quiet machine: other load {busy:.2f} cores.",
        f"One run per cell: {len(cases)} runs, direct and kipside of a cell back to back.",
    ]
    Report(
        "txn",
        "Transactions: consume-transform-produce through a marker window",
        facts(*more, tools=["kafka-python"]),
        [table("Results", list(cases), found, COLUMNS, first="client W RTT path")],
        targets(args, found),
        notes,
        ("Transactions/s, direct vs kipside, by marker window W and RTT", panels),
    ).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
