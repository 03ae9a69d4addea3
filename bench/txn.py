"""Transactions (issue 4): consume-transform-produce direct vs through kipside, marker window on.

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
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from _chart import PATH_COLORS, Panel, bar_chart
from _harness import HOST, REPO, Stack, open_stack
from _measure import Run, Window, percentile, repeat, run_json, wait_until_quiet
from _report import Report, Target, doc_args, facts, run_notes, table
from testkit.metrics import scrape
from testkit.ports import free_port
from txn_relay import ACCEPTED, END_TXN, REJECTED, MarkerWindowRelay, TxnEvent
from txn_relay import ADD_OFFSETS as ADD_O
from txn_relay import ADD_PARTITIONS as ADD_P

LOAD = REPO / "bench" / "_txn_load.py"
LABEL = {"confluent-kafka": "librdkafka", "kafka-python": "kafka-python"}
RULES = """transactions:
  - transactional_id: "bench-*"
    outputs: [{topic: bench-txn-out}]
    consumer_group: bench-txn-group
    hold_begin: {max_ms: 5000}
"""
TITLE = "Transactions: consume-transform-produce through a marker window (issue 4)"
WARMUP, DEADLINE, NOISY, NAN = 3, 90.0, 0.3, float("nan")
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
    ap, ao = count(ADD_P, ACCEPTED), count(ADD_O, ACCEPTED)
    rejected = count(ADD_P, REJECTED) + count(ADD_O, REJECTED)
    out = {"relay_txns": float(len(txns)), "ap": ap, "ao": ao, "end": count(END_TXN)}
    out |= {"accepted": ap + ao + count(END_TXN), "rejected": rejected}
    out |= {"max_adds": float(max(adds, default=0)), "gap_p50": percentile(gaps, 50)}
    out |= {"gap_max": max(gaps, default=NAN)}
    return out


def transact(
    stack: Stack, relay: MarkerWindowRelay, cell: Cell, args: argparse.Namespace, admin: int | None
) -> dict[str, float]:
    """One client process's loop on a running stack, and what the relay and kipside saw."""
    txn_id = f"bench-{cell.client}"
    work: dict[str, Any] = {"client": cell.client, "bootstrap": stack.bootstrap, "warmup": WARMUP}
    work |= {"transactional_id": txn_id, "deadline": DEADLINE}
    work |= {"transactions": args.transactions, "seconds": args.seconds}
    window = Window.of(stack).open()
    data = run_json(LOAD, json.dumps(work), timeout=DEADLINE + 15, log=stack.logdir / "load.log")
    window.close()
    out = coordinator(relay.events(txn_id), data["start"], data["end"])
    keys = ("transactions", "txn_per_s", "time_capped", "client_concurrent", "warmup_concurrent")
    out |= {k: float(data[k]) for k in keys}
    out |= {
        "p50_ms": percentile(data["latencies_ms"], 50),
        "p99_ms": percentile(data["latencies_ms"], 99),
    }
    out["noise_cores"] = window.noise_cores()
    decided = cell.rtt > 0 and out["gap_max"] == out["gap_max"]
    out["parallel"] = float(out["gap_max"] < cell.rtt) if decided else NAN
    if admin is not None:  # kipside's own upstream counts of the adds must equal the relay's
        counts, m = relay.counts(), scrape(admin)
        seen = {
            "AddPartitionsToTxn": counts.accepted_add_partitions + counts.rejected_add_partitions
        }
        seen |= {"AddOffsetsToTxn": counts.accepted_add_offsets + counts.rejected_add_offsets}
        said = {api: m.value("kipside_upstream_requests_total", 0.0, api=api) for api in seen}
        out["metrics_mismatch"] = float(said != seen)
    return out


@dataclass(frozen=True)
class Cell:
    client: str
    window: float
    rtt: float
    path: str

    @classmethod
    def of(cls, case: str) -> Cell:
        client, window, rtt, path = case.split()
        return cls(client, float(window.removeprefix("W=")), float(rtt.removeprefix("RTT=")), path)

    def case(self) -> str:
        return f"{self.client} W={self.window:g} RTT={self.rtt:g} {self.path}"


def measure(case: str, rep: int, args: argparse.Namespace) -> Run:
    """One cell on a fresh relay and Tansu; a failed run is measured once more at once."""
    cell = Cell.of(case)
    for attempt in (1, 2):
        logdir = Path(tempfile.mkdtemp(prefix=f"{rep}-", dir=args.tmp))
        relay = MarkerWindowRelay(window_ms=cell.window, delay_ms=cell.rtt / 2).start()
        admin = free_port() if cell.path == "kipside" else None
        extra = ["--rules", str(args.rules), "--admin", f"{HOST}:{admin}"] if admin else []
        run = Run(case, rep)
        try:
            with open_stack(cell.path, logdir, kipside_args=extra, relay=relay) as stack:
                run.metrics = transact(stack, relay, cell, args, admin)
                stack.check_alive()
                run.problems = stack.proxy.problems() if stack.proxy else []
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            run.problems += relay.problems()
            relay.close()
        if run.ok:
            break
        print(f"{case} failed (attempt {attempt}): {run.error}", file=sys.stderr)
    return run


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
        name = f">= {TARGET_SPEEDUP}x direct transactions/s at W=50 ms, RTT=5 ms ({LABEL[client]})"
        k = found.get(f"{client} W=50 RTT=5 kipside")
        if k is None or k["vs_direct"] != k["vs_direct"]:
            out.append(Target(name, None, "that cell was not measured, or failed"))
        else:
            out.append(Target(name, k["vs_direct"] >= TARGET_SPEEDUP, f"{k['vs_direct']:.2f}x"))
    return out


def chart(png: Path, args: argparse.Namespace, found: dict[str, dict[str, float]]) -> None:
    panels = []
    for client in args.clients:
        for rtt in args.rtts:
            cases = [f"{client} W={w:g} RTT={rtt:g} {p}" for w in args.windows for p in args.paths]
            values: list[float | None] = [found.get(c, {}).get("txn_per_s") for c in cases]
            labels = [f"W {c.split()[1][2:]}\n{c.split()[3]}" for c in cases]
            colors = [PATH_COLORS[c.split()[3]] for c in cases]
            title = f"{LABEL[client]}, RTT {rtt:g} ms"
            panels.append(Panel(title, "transactions/s", labels, values, "{:.1f}", colors=colors))
    bar_chart(png, panels, "Transactions/s, direct vs kipside, by marker window W and RTT")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    busy = wait_until_quiet(NOISY, args.quiet_wait)
    cells = [(c, r, w) for c in args.clients for r in args.rtts for w in args.windows]
    cases = [Cell(c, w, r, p).case() for c, r, w in cells for p in args.paths]
    with tempfile.TemporaryDirectory(prefix="kipbench-txn-") as tmp:
        args.tmp, args.rules = tmp, Path(tmp) / "rules.yaml"
        args.rules.write_text(RULES)
        runs = repeat(cases, 1, lambda c, rep: measure(c, rep, args), noisy=NOISY, budget=330)
    found = {r.case: r.metrics for r in runs if r.ok}
    for case, m in found.items():
        d = found.get(case.rsplit(" ", 1)[0] + " direct", {})
        m["vs_direct"] = m["txn_per_s"] / d["txn_per_s"] if d.get("txn_per_s") else NAN
    notes = run_notes(runs, NOISY)
    notes += [
        f"{c}: kipside's /metrics and the relay disagree on the adds"
        for c, m in found.items()
        if m.get("metrics_mismatch")
    ]
    notes += [
        f"{c}: the relay saw {m['relay_txns']:.0f} EndTxn for {m['transactions']:.0f} transactions"
        for c, m in found.items()
        if m["relay_txns"] != m["transactions"]
    ]
    more = [
        f"Waited up to {args.quiet_wait:g} s for a quiet machine: other load {busy:.2f} cores.",
        f"One run per cell: {len(cases)} runs, direct and kipside of a cell back to back.",
    ]
    found_table = table("Results", cases, found, COLUMNS, first="client W RTT path")
    drawn = (
        "Transactions/s direct vs kipside per W and RTT",
        partial(chart, args=args, found=found),
    )
    fx = facts(*more, tools=["kafka-python"])
    Report("txn", TITLE, fx, [found_table], targets(args, found), notes, drawn).publish(args)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--transactions", type=int, default=150, help="most measured per run")
    ap.add_argument("--seconds", type=float, default=8.0, help="most measured time per run")
    ap.add_argument("--windows", default="20,50,200", help="marker windows W, ms")
    ap.add_argument("--rtts", default="0,5", help="client side <-> broker side RTTs, ms")
    ap.add_argument("--clients", default=",".join(LABEL), help="a comma-separated subset")
    ap.add_argument("--paths", default="direct,kipside", help="a comma-separated subset")
    ap.add_argument("--quiet-wait", type=float, default=600.0, help="first wait this for quiet")
    ap.add_argument("--quick", action="store_true", help="a smoke test: one short cell pair")
    doc_args(ap)
    args = ap.parse_args(argv)
    args.windows = [float(x) for x in args.windows.split(",")]
    args.rtts = [float(x) for x in args.rtts.split(",")]
    args.clients, args.paths = args.clients.split(","), args.paths.split(",")
    if set(args.clients) - set(LABEL) or set(args.paths) - {"direct", "kipside"}:
        ap.error(f"--clients: choose from {','.join(LABEL)}; --paths from direct,kipside")
    if args.quick:
        args.transactions, args.seconds, args.windows, args.rtts = 10, 2.0, [50.0], [5.0]
        args.quiet_wait = 1.0
    return args


if __name__ == "__main__":
    sys.exit(main())
