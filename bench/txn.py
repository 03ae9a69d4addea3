"""Transactions: consume-transform-produce direct vs through kipside, marker window on.

    .venv/bin/python bench/txn.py [--transactions 150] [--seconds 8] [--windows 50]
        [--rtts 5,20] [--coordinators tansu,kafka3] [--clients confluent-kafka,kafka-python]
        [--paths direct,kipside] [--reps 3] [--quick]

Tansu has no marker-writing window after EndTxn, so every run puts tests/txn_relay.py's
MarkerWindowRelay (a fault-injecting SIMULATION of Apache Kafka's coordinator) in front of a
fresh Tansu: W ms of CONCURRENT_TRANSACTIONS after each EndTxn, RTT/2 each way; with
`kafka3` it also offers and answers DescribeTransactions, as Apache Kafka 3.0+ does, and with
`tansu` it offers what Tansu offers. kipside is a sidecar on the client side: client ->
kipside -> relay -> Tansu. One client process (bench/_txn_load.py) per run, which checks the
group's offsets and reads the output back afterwards. docs/performance.md ("Transactions")
says what each column measures.
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
from _measure import Run, Window, per_rep, percentile, repeat, run_json, wait_until_quiet
from _report import Report, Target, facts, listed, parse_args, run_notes, table
from txn_relay import ACCEPTED, DESCRIBE, END_TXN, REJECTED, MarkerWindowRelay, TxnEvent
from txn_relay import ADD_OFFSETS as ADD_O
from txn_relay import ADD_PARTITIONS as ADD_P

LOAD = REPO / "bench" / "_txn_load.py"
CLIENTS = {"confluent-kafka": "librdkafka", "kafka-python": "kafka-python"}
COORDINATORS = {"tansu": "no DescribeTransactions", "kafka3": "DescribeTransactions"}
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--transactions": (int, 150, "most measured per run"),
    "--seconds": (float, 12.0, "most measured time per run"),
    "--windows": (listed(float), [50.0], "marker windows W, ms"),
    "--rtts": (listed(float), [5.0, 20.0], "client side <-> broker side RTTs, ms"),
    "--coordinators": (
        listed(str, list(COORDINATORS)),
        list(COORDINATORS),
        "the simulated coordinator: tansu (offers what Tansu does), kafka3 (DescribeTransactions)",
    ),
    "--clients": (listed(str, list(CLIENTS)), list(CLIENTS), "a comma-separated subset"),
    "--paths": (listed(str, ["direct", "kipside"]), ["direct", "kipside"], "a subset"),
    "--reps": (int, 3, "repetitions of every cell"),
    "--quiet-wait": (float, 600.0, "first wait this long for quiet"),
}
QUICK = {"transactions": 10, "seconds": 2.0, "rtts": [5.0], "reps": 1, "quiet_wait": 1.0}
QUICK |= {"coordinators": ["tansu"]}
RULES = """transactions:
  - transactional_id: "bench-*"
    outputs: [{topic: bench-txn-out}]
    consumer_group: bench-txn-group
    hold_begin: {max_ms: 5000}
"""
WARMUP, DEADLINE, NOISY, NAN = 3, 105.0, 0.3, float("nan")
TARGET_SPEEDUP, TARGET_CT, TARGET_ADDS = 1.3, 0.25, 2
SPEED_CELLS = [("confluent-kafka", 50.0, 20.0), ("confluent-kafka", 50.0, 5.0)]
SPEED_CELLS += [("kafka-python", 50.0, 5.0)]
COLUMNS = [
    ("txns", "{transactions:.0f}"),
    ("txn/s", "{txn_per_s:.1f}"),
    ("vs direct (range)", "{vs_direct:.2f}x ({vs_direct_low:.2f}-{vs_direct_high:.2f})"),
    ("p50 / p99 ms", "{p50_ms:.1f} / {p99_ms:.1f}"),
    ("CT/txn (vs direct)", "{rejected:.2f} ({ct_vs_direct:.2f}x)"),
    ("asked/txn", "{asked:.2f}"),
    ("coord req/txn (AP+AO+EndTxn)", "{accepted:.2f} ({ap:.1f}+{ao:.1f}+{end:.1f})"),
    ("all coord req/txn", "{coordinator_requests:.2f}"),
    ("first AP-AO gap max ms", "{gap_max:.2f}"),
    ("accepted AP-AO gap max ms (txns >= RTT)", "{accepted_gap_max:.2f} ({two_rounds:.0f})"),
    ("begins after window p50 ms", "{late_p50:.1f}"),
    ("CT seen by client", "{client_concurrent:.0f}"),
    ("committed once / offsets / read once", "{commits_ok:.0f} / {offsets_ok:.0f} / {read_ok:.0f}"),
    ("kipside CPU ms/txn", "{proxy_cpu_ms:.2f}"),
    ("other load (cores)", "{noise_cores:.2f}"),
]


def coordinator(
    events: Sequence[TxnEvent], start: float, end: float, window: float, rtt: float
) -> dict[str, float]:
    """What the relay saw of the transactions whose EndTxn it answered in [start, end]: per
    transaction, accepted and rejected adds, questions, EndTxns, how far apart the first (and
    the first accepted) AddPartitionsToTxn and AddOffsetsToTxn reached it, and how long after
    the previous window's end the first accepted add reached it."""
    txns, current, late = [], list[TxnEvent](), list[float]()
    ended: float | None = None
    for event in events:
        current.append(event)
        if event.kind == END_TXN and event.error_code == 0:
            if start <= event.at <= end:
                txns.append(current)
                first = next(
                    (e.at for e in current if e.kind in (ADD_P, ADD_O) and e.outcome == ACCEPTED),
                    None,
                )
                if ended is not None and first is not None:
                    late.append((first - ended - window / 1000) * 1000)
            current, ended = [], event.at
    n = max(len(txns), 1)

    def count(kind: str, outcome: str | None = None) -> float:
        return sum(e.kind == kind and outcome in (None, e.outcome) for t in txns for e in t) / n

    gaps: list[float] = []
    accepted_gaps: list[float] = []
    adds: list[int] = []
    for t in txns:
        for into, outcome in ((gaps, None), (accepted_gaps, ACCEPTED)):
            firsts = [
                next((e.at for e in t if e.kind == k and outcome in (None, e.outcome)), None)
                for k in (ADD_P, ADD_O)
            ]
            if firsts[0] is not None and firsts[1] is not None:
                into.append(abs(firsts[1] - firsts[0]) * 1000)
        adds.append(sum(e.kind in (ADD_P, ADD_O) and e.outcome == ACCEPTED for e in t))
    two_rounds = sum(1 for g in accepted_gaps if g >= rtt)
    ap, ao, ends = count(ADD_P, ACCEPTED), count(ADD_O, ACCEPTED), count(END_TXN)
    rejected = count(ADD_P, REJECTED) + count(ADD_O, REJECTED)
    asked = count(DESCRIBE)
    return {
        "relay_txns": float(len(txns)),
        "ap": ap,
        "ao": ao,
        "end": ends,
        "accepted": ap + ao + ends,
        "rejected": rejected,
        "asked": asked,
        "coordinator_requests": ap + ao + ends + rejected + asked,
        "max_adds": float(max(adds, default=0)),
        "gap_max": max(gaps, default=NAN),
        "accepted_gap_max": max(accepted_gaps, default=NAN),
        "two_rounds": float(two_rounds),
        "late_p50": percentile(late, 50),
    }


def outcomes(events: Sequence[TxnEvent], data: dict[str, Any]) -> dict[str, float]:
    """1.0 where the run's transactions (warm-up included) were each committed once (the
    relay saw one successful committing EndTxn per transaction and no abort), the group's
    offset is their number, and every record they wrote is read back read_committed once."""
    total = WARMUP + int(data["transactions"])
    ends = [e for e in events if e.kind == END_TXN]
    committed = sum(1 for e in ends if e.error_code == 0 and e.committed)
    aborted = sum(1 for e in ends if not e.committed)
    checked = data["checked"]
    read_ok = checked["read_once"] == checked["written"]
    read_ok = read_ok and not checked["read_again"] and not checked["read_stray"]
    return {
        "commits_ok": float(committed == total and not aborted),
        "offsets_ok": float(checked["group_offset"] == total),
        "read_ok": float(read_ok),
    }


def transact(
    client: str,
    window: float,
    rtt: float,
    kind: str,
    path: str,
    args: argparse.Namespace,
    logdir: Path,
) -> dict[str, float]:
    """One client process's loop on a fresh relay, Tansu (and kipside), and what the relay saw."""
    relay = MarkerWindowRelay(
        window_ms=window, delay_ms=rtt / 2, describe_transactions=kind == "kafka3"
    ).start()
    txn_id = f"bench-{client}"
    try:
        with open_stack(path, logdir, rules=RULES, relay=relay) as stack:
            work = {"client": client, "bootstrap": stack.bootstrap, "warmup": WARMUP}
            work |= {"transactional_id": txn_id}
            work |= {"transactions": args.transactions, "seconds": args.seconds}
            w = Window.of(stack)
            data = run_json(LOAD, json.dumps(work), timeout=DEADLINE, log=logdir / "load.log")
            w.close()
    finally:
        relay.close()
        with (logdir / PROXY_LOG).open("a") as log:  # noted with what kipside logged
            log.writelines(f"WARNING relay: {problem}\n" for problem in relay.problems())
    events = relay.events(txn_id)
    out = coordinator(events, data["start"], data["end"], window, rtt) | outcomes(events, data)
    keys = ("transactions", "txn_per_s", "time_capped", "client_concurrent", "warmup_concurrent")
    out |= {k: float(data[k]) for k in keys}
    out["p50_ms"] = percentile(data["latencies_ms"], 50)
    out["p99_ms"] = percentile(data["latencies_ms"], 99)
    out["noise_cores"] = w.noise_cores()
    proxy_cpu, _ = w.proxy_broker()
    out["proxy_cpu_ms"] = proxy_cpu * 1000 / (WARMUP + data["transactions"])
    return out


def cell(case: str) -> str:
    """The case's cell (all but its path)."""
    return case.rsplit(" ", 1)[0]


def _ratio(a: float, b: float) -> float:
    return a / b if b else NAN


def compare(runs: list[Run], cases: Sequence[str]) -> dict[str, dict[str, float]]:
    """Every case's medians, with kipside's ratios to direct of the same repetition."""
    found: dict[str, dict[str, float]] = {}
    for case in cases:
        ok = [r for r in runs if r.case == case and r.ok]
        if not ok:
            continue
        m = {k: percentile([r.metrics[k] for r in ok], 50) for k in ok[0].metrics}
        for k in ("commits_ok", "offsets_ok", "read_ok"):
            m[k] = min(r.metrics[k] for r in ok)  # 1 only if every repetition was right
        direct = f"{cell(case)} direct"
        speed = per_rep(
            runs, case, direct, lambda k, d: k.metrics["txn_per_s"] / d.metrics["txn_per_s"]
        )
        ct = per_rep(
            runs, case, direct, lambda k, d: _ratio(k.metrics["rejected"], d.metrics["rejected"])
        )
        m |= {"vs_direct": percentile(speed, 50) if speed else NAN}
        m |= {"vs_direct_low": min(speed, default=NAN)}
        m |= {"vs_direct_high": max(speed, default=NAN)}
        m |= {"ct_vs_direct": percentile(ct, 50) if ct else NAN}
        m |= {"ct_vs_direct_high": max(ct, default=NAN)}
        found[case] = m
    return found


def targets(args: argparse.Namespace, found: dict[str, dict[str, float]]) -> list[Target]:
    kip = {c: m for c, m in found.items() if c.endswith("kipside")}
    if not kip:
        return [Target("kipside targets", None, "no kipside run succeeded")]
    out = []
    for client, window, rtt in SPEED_CELLS:
        for kind in args.coordinators:
            name = f">= {TARGET_SPEEDUP}x direct transactions/s at W={window:g} ms, RTT={rtt:g} ms"
            name += f" ({CLIENTS[client]}, {kind})"
            k = found.get(f"{client} W={window:g} RTT={rtt:g} {kind} kipside")
            if k is None or k["vs_direct"] != k["vs_direct"]:
                out.append(Target(name, None, "that cell was not measured, or failed"))
                continue
            low, high = k["vs_direct_low"], k["vs_direct_high"]
            detail = f"median {k['vs_direct']:.2f}x, repetitions {low:.2f}x to {high:.2f}x"
            out.append(Target(name, low >= TARGET_SPEEDUP, detail))
    worst = max((m["ct_vs_direct_high"] for m in kip.values()), default=NAN)
    name = f"CONCURRENT_TRANSACTIONS through kipside <= {TARGET_CT}x direct's, every cell"
    out.append(Target(name, worst <= TARGET_CT, f"at most {worst:.2f}x in any repetition"))
    seen = sum(m["client_concurrent"] + m["warmup_concurrent"] for m in kip.values())
    name = "0 CONCURRENT_TRANSACTIONS reach a client through kipside"
    out.append(Target(name, seen == 0, f"{seen:.0f} in the kipside cells' medians"))
    right = all(m["commits_ok"] and m["offsets_ok"] and m["read_ok"] for m in found.values())
    name = "every transaction committed once, group offsets = transactions, read back once"
    out.append(Target(name, right, "every repetition of every cell" if right else "see the table"))
    adds = max(m["max_adds"] for m in kip.values())
    gaps = {c: m["accepted_gap_max"] for c, m in kip.items()}
    rtts = {c: float(c.split("RTT=")[1].split()[0]) for c in kip}
    serial = [c for c, g in gaps.items() if not g < rtts[c]]
    name = f"registration: <= {TARGET_ADDS} accepted adds per transaction, in one round trip"
    detail = f"at most {adds:.0f} accepted adds; accepted AddPartitionsToTxn and AddOffsetsToTxn "
    detail += f"less than one RTT apart in every transaction of {len(gaps) - len(serial)} of "
    detail += f"{len(gaps)} kipside cells (median run)" + (f"; not in {serial}" if serial else "")
    out.append(Target(name, adds <= TARGET_ADDS and not serial, detail))
    return out


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    busy = wait_until_quiet(NOISY, args.quiet_wait)
    cases = {
        f"{c} W={w:g} RTT={r:g} {k} {p}": partial(transact, c, w, r, k, p, args)
        for c in args.clients
        for r in args.rtts
        for w in args.windows
        for k in args.coordinators
        for p in args.paths
    }
    runs = repeat(cases, args.reps, noisy=NOISY, retries=0, budget=0)
    found = compare(runs, list(cases))
    notes = run_notes(runs, NOISY)
    notes += [
        f"{r.case} rep {r.rep}: the relay saw {r.metrics['relay_txns']:.0f} EndTxn for "
        f"{r.metrics['transactions']:.0f} transactions"
        for r in runs
        if r.ok and r.metrics["relay_txns"] != r.metrics["transactions"]
    ]
    panels = []
    for c, r in [(c, r) for c in args.clients for r in args.rtts]:
        series = {
            f"{p} ({k})": [f"{c} W={w:g} RTT={r:g} {k} {p}" for w in args.windows]
            for k in args.coordinators
            for p in args.paths
        }
        labels = [f"W {w:g} ms" for w in args.windows]
        title = f"{CLIENTS[c]}, RTT {r:g} ms: transactions/s (median)"
        panels.append(grouped(title, found, "txn_per_s", labels, series, "{:.1f}"))
    more = [
        f"Waited up to {args.quiet_wait:g} s for a quiet machine: other load {busy:.2f} cores.",
        f"{args.reps} repetition(s) of {len(cases)} runs, direct and kipside of a cell back to "
        "back; medians, and the range of kipside's ratio to direct over the repetitions.",
    ]
    Report(
        "txn",
        "Transactions: consume-transform-produce through a marker window",
        facts(*more, tools=["kafka-python"]),
        [table("Results", list(cases), found, COLUMNS, first="client W RTT coordinator path")],
        targets(args, found),
        notes,
        ("Transactions/s, direct vs kipside, by marker window W and RTT", panels),
    ).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
