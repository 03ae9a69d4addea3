"""Transactions (issue 4): consume-transform-produce direct vs through kipside, marker window on.

    .venv/bin/python bench/txn.py [--transactions 150] [--seconds 8] [--windows 20,50,200]
                                  [--rtts 0,5] [--clients confluent-kafka,kafka-python]

Apache Kafka's transaction coordinator answers EndTxn once PrepareCommit is logged and then
writes the markers; until they are written it answers the transactional id's next
AddPartitionsToTxn/AddOffsetsToTxn with CONCURRENT_TRANSACTIONS (kafka-rules.md,
"Transactions"). Tansu has no such window, so every run puts tests/txn_relay.py's
MarkerWindowRelay (a fault-injecting SIMULATION of that coordinator behaviour, in this
process) in front of a fresh in-memory Tansu that advertises the relay's address. The relay
adds the window W after each successful EndTxn and a one-way delay RTT/2 in each direction
between the client side and the broker side. kipside is a sidecar, on the client side:

    direct:  client -> relay(W, RTT) -> Tansu
    kipside: client -> kipside --rules -> relay(W, RTT) -> Tansu

kipside's rule file declares the loop's output topic (all partitions) and consumer group for
`bench-*` transactional ids, hold_begin.max_ms 5000.

For each client (confluent-kafka/librdkafka, kafka-python), W, RTT and path, one process
(bench/_txn_load.py) creates the topics, fills the input, and runs the loop: read an input
record, begin, produce to all 8 output partitions, send the input offset to the transaction
for the group, commit. A few warm-up transactions, then up to --transactions measured ones
or --seconds, whichever comes first. Reported per run:

- transactions/s and p50/p99 transaction latency (begin called -> commit returned);
- coordinator requests per transaction, counted by the relay for the measured transactions
  only (their EndTxn answered inside the measured window): accepted (forwarded)
  AddPartitionsToTxn + AddOffsetsToTxn + EndTxn, and separately the adds the relay answered
  CONCURRENT_TRANSACTIONS in the window (direct: the client's own retries; kipside: its
  begin-hold retries);
- whether the transaction's first AddPartitionsToTxn and first AddOffsetsToTxn were in
  flight together: the relay saw them less than one relay round trip (2 x one-way delay)
  apart, so the second was sent before the first's answer could have come back (decisive
  only with RTT > 0);
- CONCURRENT_TRANSACTIONS the client itself received, from its own logs (librdkafka `eos`
  debug log, kafka-python's TransactionManager DEBUG records).

Prints a table and rewrites the `txn` section of docs/performance.md and docs/img/txn.png.
All targets are loopback; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    HOST,
    REPO,
    HarnessError,
    Managed,
    exit_cleanly_on_sigterm,
    kipside_available,
    machine_busy_seconds,
    start_kipside,
    start_tansu,
    wait_until_quiet,
)
from _kipside import scrape
from _report import (
    DOC,
    IMG_DIR,
    PATH_COLORS,
    Panel,
    bar_chart,
    command_line,
    facts_markdown,
    machine_info,
    markdown_table,
    text_table,
    utc_now,
    versions,
    write_section,
)

# The relay is test code (tests/txn_relay.py); tests/ is no package, so put it on the path.
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from txn_relay import (
    ACCEPTED,
    ADD_OFFSETS,
    ADD_PARTITIONS,
    END_TXN,
    REJECTED,
    MarkerWindowRelay,
    TxnEvent,
)

from kipside.proxy.devbroker import free_port

SECTION = "txn"
LOAD = Path(__file__).resolve().parent / "_txn_load.py"
CLIENTS: tuple[str, ...] = ("confluent-kafka", "kafka-python")
CLIENT_LABEL = {"confluent-kafka": "librdkafka", "kafka-python": "kafka-python"}
PATHS: tuple[str, ...] = ("direct", "kipside")
OUTPUT_TOPIC = "bench-txn-out"
INPUT_TOPIC = "bench-txn-in"
GROUP = "bench-txn-group"
OUT_PARTITIONS = 8
HOLD_MAX_MS = 5000
WARMUP = 3
CALL_TIMEOUT = 20.0
WORKER_DEADLINE = 90.0

# Targets of issue 4.
TARGET_SPEEDUP = 1.3
TARGET_WINDOW = 50.0
TARGET_RTT = 5.0
TARGET_ADDS = 2
NOISE_CORES = 0.3
OTHER_BENCHMARKS = "bench/(throughput|coalesce)"


def rules_yaml() -> str:
    return (
        "transactions:\n"
        '  - transactional_id: "bench-*"\n'
        "    outputs:\n"
        f"      - topic: {OUTPUT_TOPIC}\n"
        f"    consumer_group: {GROUP}\n"
        f"    hold_begin: {{max_ms: {HOLD_MAX_MS}}}\n"
    )


@dataclass(frozen=True)
class Cell:
    client: str
    window_ms: float
    rtt_ms: float
    path: str

    @property
    def delay_ms(self) -> float:
        return self.rtt_ms / 2

    def name(self) -> str:
        return f"{CLIENT_LABEL[self.client]} W={self.window_ms:g} RTT={self.rtt_ms:g} {self.path}"

    def pair(self) -> tuple[str, float, float]:
        return (self.client, self.window_ms, self.rtt_ms)


# --------------------------------------------------------------------------- relay counts


@dataclass
class Coordinator:
    """What the relay saw for the measured transactions (between the coordinator and the rest)."""

    transactions: int = 0
    accepted_add_partitions: int = 0
    accepted_add_offsets: int = 0
    rejected_add_partitions: int = 0
    rejected_add_offsets: int = 0
    end_txn: int = 0
    aborts: int = 0
    max_accepted_adds: int = 0
    first_gaps_ms: list[float] = field(default_factory=list)
    accepted_gaps_ms: list[float] = field(default_factory=list)
    without_both: int = 0

    def per_txn(self, value: int) -> float:
        return value / self.transactions if self.transactions else float("nan")

    @property
    def accepted(self) -> int:
        return self.accepted_add_partitions + self.accepted_add_offsets + self.end_txn

    @property
    def rejected(self) -> int:
        return self.rejected_add_partitions + self.rejected_add_offsets


def coordinator_counts(events: Sequence[TxnEvent], start: float, end: float) -> Coordinator:
    """Split one id's relay events into transactions (each ends with an EndTxn the broker
    answered without error) and count those whose EndTxn was answered in [start, end]."""
    out = Coordinator()
    current: list[TxnEvent] = []
    for event in events:
        current.append(event)
        if event.kind != END_TXN or event.error_code != 0:
            continue
        txn, current = current, []
        if not start <= event.at <= end:
            continue
        out.transactions += 1
        if event.committed is False:
            out.aborts += 1
        adds_p = [e for e in txn if e.kind == ADD_PARTITIONS]
        adds_o = [e for e in txn if e.kind == ADD_OFFSETS]
        acc_p = [e for e in adds_p if e.outcome == ACCEPTED]
        acc_o = [e for e in adds_o if e.outcome == ACCEPTED]
        out.accepted_add_partitions += len(acc_p)
        out.accepted_add_offsets += len(acc_o)
        out.rejected_add_partitions += sum(1 for e in adds_p if e.outcome == REJECTED)
        out.rejected_add_offsets += sum(1 for e in adds_o if e.outcome == REJECTED)
        out.end_txn += sum(1 for e in txn if e.kind == END_TXN)
        out.max_accepted_adds = max(out.max_accepted_adds, len(acc_p) + len(acc_o))
        if adds_p and adds_o:
            out.first_gaps_ms.append(abs(adds_o[0].at - adds_p[0].at) * 1000)
        else:
            out.without_both += 1
        if acc_p and acc_o:
            out.accepted_gaps_ms.append(abs(acc_o[0].at - acc_p[0].at) * 1000)
    return out


# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    cell: Cell
    data: dict[str, Any] = field(default_factory=dict)
    coord: Coordinator | None = None
    error: str | None = None
    log_problems: list[str] = field(default_factory=list)
    relay_problems: list[str] = field(default_factory=list)
    noise_cores: float = 0.0
    wall_s: float = 0.0
    kipside_exit: int | None = None
    metrics_mismatch: str | None = None
    earlier_error: str | None = None
    """The error of a first attempt that failed (this run is the second)."""
    noisy_first: float | None = None
    """Other load (cores) during an earlier attempt of this pair, which was measured again."""

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.data)

    @property
    def txn_per_s(self) -> float:
        return float(self.data.get("txn_per_s", float("nan")))

    def latency(self, p: float) -> float:
        return percentile(self.data.get("latencies_ms", []), p)

    def parallel(self) -> bool | None:
        """First AddPartitionsToTxn and AddOffsetsToTxn of every measured transaction in flight
        together (None: not decidable, RTT 0, or no transaction had both)."""
        if self.coord is None or not self.coord.first_gaps_ms or self.cell.delay_ms <= 0:
            return None
        return max(self.coord.first_gaps_ms) < 2 * self.cell.delay_ms


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[idx]


def _stop_quietly(proc: Managed | None) -> None:
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stop()


@contextlib.contextmanager
def relay_stack(cell: Cell, logdir: Path) -> Iterator[tuple[MarkerWindowRelay, Managed, int]]:
    """The relay (window W, one-way delay RTT/2) and a fresh Tansu advertising it."""
    relay = MarkerWindowRelay(window_ms=cell.window_ms, delay_ms=cell.delay_ms).start()
    broker: Managed | None = None
    try:
        broker, port = start_tansu(logdir, advertised_port=relay.port)
        relay.upstream = (HOST, port)
        yield relay, broker, port
    finally:
        _stop_quietly(broker)
        relay.close()


def _rusage_cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def measure(cell: Cell, args: argparse.Namespace, logroot: Path, attempt: int = 1) -> Run:
    run = Run(cell)
    logdir = logroot / (cell.name().replace(" ", "_").replace("=", "") + f"-{attempt}")
    logdir.mkdir()
    wait_until_quiet(max_busy_cores=NOISE_CORES, timeout=args.quiet_wait)
    started = time.monotonic()
    txn_id = f"bench-{cell.client}-{cell.path}"
    kipside: Managed | None = None
    admin_port = 0
    try:
        with relay_stack(cell, logdir) as (relay, broker, _port):
            bootstrap = relay.bootstrap
            if cell.path == "kipside":
                rules = logdir / "rules.yaml"
                rules.write_text(rules_yaml())
                admin_port = free_port(HOST)
                kipside, port = start_kipside(
                    logdir,
                    relay.port,
                    extra_args=["--rules", str(rules), "--admin", f"{HOST}:{admin_port}"],
                )
                bootstrap = f"{HOST}:{port}"
            try:
                work = {
                    "client": cell.client,
                    "bootstrap": bootstrap,
                    "transactional_id": txn_id,
                    "input_topic": INPUT_TOPIC,
                    "output_topic": OUTPUT_TOPIC,
                    "partitions": OUT_PARTITIONS,
                    "group": GROUP,
                    "warmup": WARMUP,
                    "transactions": args.transactions,
                    "seconds": args.seconds,
                    "input_records": args.transactions + WARMUP + 10,
                    "call_timeout": CALL_TIMEOUT,
                    "deadline": WORKER_DEADLINE,
                }
                procs = [p for p in (broker, kipside) if p is not None]
                cpu0 = _rusage_cpu() + sum(p.cpu_seconds() for p in procs)
                busy0, t0 = machine_busy_seconds(), time.monotonic()
                run.data = run_load(work, logdir)
                busy = machine_busy_seconds() - busy0
                ours = _rusage_cpu() + sum(p.cpu_seconds() for p in procs) - cpu0
                run.noise_cores = max(0.0, busy - ours) / (time.monotonic() - t0)
                broker.check_alive()
                if kipside is not None:
                    kipside.check_alive()
                    run.metrics_mismatch = _compare_metrics(scrape(admin_port), relay)
            finally:
                run.relay_problems = relay.problems()
                run.coord = coordinator_counts(
                    relay.events(txn_id), float(run.data.get("start", 0)), run.data.get("end", 0)
                )
                if kipside is not None:
                    kipside.stop()
                    run.kipside_exit = kipside.popen.returncode
                    run.log_problems = kipside.log_problems()
    except Exception as exc:  # one failed cell must not lose the others
        run.error = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
    finally:
        _stop_quietly(kipside)
    run.wall_s = time.monotonic() - started
    return run


def _compare_metrics(metrics: dict[str, float], relay: MarkerWindowRelay) -> str | None:
    """kipside's own upstream counts of the adds must equal what the relay saw."""
    counts = relay.counts()
    pairs = {
        "AddPartitionsToTxn": counts.accepted_add_partitions + counts.rejected_add_partitions,
        "AddOffsetsToTxn": counts.accepted_add_offsets + counts.rejected_add_offsets,
    }
    wrong = []
    for api, seen in pairs.items():
        said = metrics.get(f'kipside_upstream_requests_total{{api="{api}"}}', 0.0)
        if int(said) != seen:
            wrong.append(f"{api}: kipside /metrics {said:.0f}, relay {seen}")
    return "; ".join(wrong) or None


def run_load(work: dict[str, Any], logdir: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run(
            [sys.executable, str(LOAD), json.dumps(work)],
            capture_output=True,
            text=True,
            timeout=WORKER_DEADLINE + 15,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(
            f"the client process did not finish in {WORKER_DEADLINE + 15} s"
        ) from exc
    (logdir / "load.stderr").write_text(done.stderr)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise HarnessError(f"the client process failed (code {done.returncode}):\n{tail}")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise HarnessError(f"the client process printed no result:\n{done.stdout[-2000:]}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


# --------------------------------------------------------------------------- waiting


def other_benchmarks() -> list[str]:
    done = subprocess.run(
        ["pgrep", "-af", OTHER_BENCHMARKS], capture_output=True, text=True, timeout=10
    )
    me = {str(os.getpid()), str(os.getppid())}
    return [ln for ln in done.stdout.splitlines() if ln.split(" ", 1)[0] not in me]


def wait_for_machine(limit_s: float) -> tuple[float, float, list[str]]:
    """Wait (at most limit_s) until no other benchmark runs and the machine is quiet.

    Returns (seconds waited, busy cores of the last sample, other benchmarks still running).
    """
    t0 = time.monotonic()
    busy = 0.0
    others = other_benchmarks()
    announced = False
    while True:
        remaining = limit_s - (time.monotonic() - t0)
        others = other_benchmarks()
        if not others:
            busy = wait_until_quiet(
                max_busy_cores=NOISE_CORES, timeout=max(0.0, min(remaining, 30))
            )
            if busy < NOISE_CORES:
                break
        if remaining <= 0:
            break
        if not announced:
            why = f"{len(others)} other benchmark process(es)" if others else f"{busy:.2f} cores"
            print(f"waiting for a quiet machine ({why})", file=sys.stderr)
            announced = True
        time.sleep(min(5.0, max(0.1, remaining)))
    return time.monotonic() - t0, busy, others


# --------------------------------------------------------------------------- tables


def _f(v: float, digits: int = 1) -> str:
    return "n/a" if v != v else f"{v:.{digits}f}"


HEADERS = [
    "client",
    "W ms",
    "RTT ms",
    "path",
    "txns",
    "txn/s",
    "vs direct",
    "p50 / p99 ms",
    "coord req/txn (AP+AO+EndTxn)",
    "in-window CT/txn (hold retries)",
    "max accepted adds/txn",
    "AP-AO gap p50 / max ms",
    "CT seen by client",
]


def rows(runs: Sequence[Run]) -> list[list[str]]:
    direct = {r.cell.pair(): r for r in runs if r.cell.path == "direct" and r.ok}
    out = []
    for r in runs:
        head = [
            CLIENT_LABEL[r.cell.client],
            f"{r.cell.window_ms:g}",
            f"{r.cell.rtt_ms:g}",
            r.cell.path,
        ]
        if not r.ok:
            first = (r.error or "no result").strip().splitlines()[0][:70]
            out.append([*head, f"failed: {first}", *[""] * (len(HEADERS) - 5)])
            continue
        d = direct.get(r.cell.pair())
        ratio = f"{r.txn_per_s / d.txn_per_s:.2f}x" if d and d.txn_per_s > 0 else "-"
        c = r.coord or Coordinator()
        acc = (
            f"{_f(c.per_txn(c.accepted), 2)} "
            f"({_f(c.per_txn(c.accepted_add_partitions), 1)}+"
            f"{_f(c.per_txn(c.accepted_add_offsets), 1)}+{_f(c.per_txn(c.end_txn), 1)})"
        )
        rejected = _f(c.per_txn(c.rejected), 2)
        if r.cell.path == "kipside":
            rejected += " (hold)"
        gaps = (
            f"{_f(percentile(c.first_gaps_ms, 50), 2)} / {_f(max(c.first_gaps_ms), 2)}"
            if c.first_gaps_ms
            else "n/a"
        )
        parallel = r.parallel()
        if parallel is not None:
            gaps += " (parallel)" if parallel else " (sequential)"
        capped = " (time-capped)" if r.data.get("time_capped") else ""
        out.append(
            [
                *head,
                f"{r.data['transactions']}{capped}",
                _f(r.txn_per_s, 1),
                ratio,
                f"{_f(r.latency(50))} / {_f(r.latency(99))}",
                acc,
                rejected,
                str(c.max_accepted_adds),
                gaps,
                str(r.data["client_concurrent"]),
            ]
        )
    return out


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    name: str
    status: str  # "met", "missed", "not measured"
    detail: str


def evaluate(runs: Sequence[Run], clients: Sequence[str]) -> list[Target]:
    out: list[Target] = []
    kip = [r for r in runs if r.cell.path == "kipside" and r.ok]

    def add(name: str, ok: bool | None, detail: str) -> None:
        out.append(
            Target(name, "not measured" if ok is None else ("met" if ok else "missed"), detail)
        )

    name = "0 CONCURRENT_TRANSACTIONS reach a client through kipside"
    if kip:
        seen = {
            r.cell.name(): int(r.data["client_concurrent"])
            + int(r.data.get("client_concurrent_warmup", 0))
            for r in kip
        }
        bad = {k: v for k, v in seen.items() if v}
        total = sum(seen.values())
        detail = f"{total} in {len(kip)} kipside runs (warm-up transactions included)"
        if bad:
            detail += ": " + ", ".join(f"{k}: {v}" for k, v in bad.items())
        add(name, total == 0, detail)
    else:
        add(name, None, "no kipside run succeeded")

    name = f"<= {TARGET_ADDS} coordinator round trips before EndTxn, in parallel (kipside)"
    if kip:
        worst = max(r.coord.max_accepted_adds if r.coord else 0 for r in kip)
        decided = [r for r in kip if r.parallel() is not None]
        sequential = [r.cell.name() for r in decided if not r.parallel()]
        per_txn = [
            r.coord.per_txn(r.coord.accepted_add_partitions + r.coord.accepted_add_offsets)
            for r in kip
            if r.coord and r.coord.transactions
        ]
        detail = (
            f"accepted upstream AddPartitionsToTxn + AddOffsetsToTxn per transaction: at most "
            f"{worst} (mean {min(per_txn):.2f}-{max(per_txn):.2f} per run); first "
            f"AddPartitionsToTxn and AddOffsetsToTxn less than one relay round trip apart in "
            f"every transaction of {len(decided) - len(sequential)} of {len(decided)} runs with "
            "RTT > 0"
            if per_txn
            else "no measured transaction"
        )
        if sequential:
            detail += f"; not in: {', '.join(sequential)}"
        add(
            name,
            bool(per_txn) and worst <= TARGET_ADDS and bool(decided) and not sequential,
            detail,
        )
    else:
        add(name, None, "no kipside run succeeded")

    for client in clients:
        name = (
            f">= {TARGET_SPEEDUP}x direct transactions/s at W={TARGET_WINDOW:g} ms, "
            f"RTT={TARGET_RTT:g} ms ({CLIENT_LABEL[client]})"
        )
        pair = (client, TARGET_WINDOW, TARGET_RTT)
        k = next((r for r in kip if r.cell.pair() == pair), None)
        d = next(
            (r for r in runs if r.cell.pair() == pair and r.cell.path == "direct" and r.ok), None
        )
        if k is None or d is None or d.txn_per_s <= 0:
            add(name, None, "that cell was not measured (or failed)")
            continue
        ratio = k.txn_per_s / d.txn_per_s
        add(
            name,
            ratio >= TARGET_SPEEDUP,
            f"{ratio:.2f}x ({k.txn_per_s:.1f} vs {d.txn_per_s:.1f} txn/s)",
        )
    return out


# --------------------------------------------------------------------------- chart


def chart(runs: Sequence[Run], args: argparse.Namespace, png: Path) -> None:
    by = {(r.cell.pair(), r.cell.path): r for r in runs}
    panels = []
    for client in args.clients:
        for rtt in args.rtts:
            labels: list[str] = []
            values: list[float | None] = []
            colors: list[str] = []
            for w in args.windows:
                for path in PATHS:
                    run = by.get(((client, w, rtt), path))
                    labels.append(f"W {w:g}\n{path}")
                    values.append(run.txn_per_s if run is not None and run.ok else None)
                    colors.append(PATH_COLORS[path])
            panels.append(
                Panel(
                    f"{CLIENT_LABEL[client]}, RTT {rtt:g} ms",
                    "transactions/s",
                    labels,
                    values,
                    fmt="{:.1f}",
                    colors=colors,
                    missing="failed",
                )
            )
    bar_chart(
        png,
        panels,
        "Consume-transform-produce transactions/s, direct vs kipside, by marker window W "
        "(simulated) and RTT",
    )


# --------------------------------------------------------------------------- the document


def section(
    args: argparse.Namespace,
    runs: Sequence[Run],
    targets: Sequence[Target],
    png: Path,
    started: str,
    wall: float,
    waited: tuple[float, float, list[str]],
    load: float,
    skipped: str | None,
    sched: Schedule,
) -> str:
    import kafka

    vers = versions(haproxy=None)
    vers["kafka-python"] = str(kafka.__version__)
    facts = facts_markdown(command_line(), started, machine_info(), vers)
    lines = [
        "## Transactions: consume-transform-produce through a marker window (issue 4)",
        "",
        "Written by `bench/txn.py`. Tansu has no marker-writing window after EndTxn, so every "
        "run puts `MarkerWindowRelay` (tests/txn_relay.py, a fault-injecting **simulation** of "
        "Apache Kafka's coordinator) in front of a fresh in-memory Tansu: for W ms after each "
        "successful EndTxn it answers that transactional id's AddPartitionsToTxn/AddOffsetsToTxn "
        "with CONCURRENT_TRANSACTIONS itself, and it delays every frame by RTT/2 in each "
        "direction (a network between the client side and the broker side). kipside is a "
        "sidecar, on the client side: direct = client -> relay -> Tansu; kipside = client -> "
        "kipside -> relay -> Tansu.",
        "",
        facts.rstrip(),
        f"- Wall time {wall:.0f} s, {sched.measuring_s:.0f} s of it measuring; 1-minute load "
        f"average {load:.2f} when it started; waited {waited[0]:.0f} s for a quiet machine "
        "first.",
        "",
        "Setup:",
        f"- The loop, one client in its own process: read the next record of a one-partition "
        f"input topic (assigned consumer), begin, produce one record to each of the "
        f"{OUT_PARTITIONS} output partitions, `send_offsets_to_transaction` for group "
        f"`{GROUP}`, commit. No aborts. {WARMUP} warm-up transactions, then up to "
        f"{args.transactions} measured ones or {args.seconds:g} s, whichever comes first.",
        "- Clients: confluent-kafka (librdkafka; linger.ms=1) and kafka-python (linger_ms=1), "
        "default retry settings.",
        f'- kipside rule: `transactions: [{{transactional_id: "bench-*", outputs: '
        f"[{{topic: {OUTPUT_TOPIC}}}], consumer_group: {GROUP}, hold_begin: "
        f"{{max_ms: {HOLD_MAX_MS}}}}}]`.",
        "- **txn/s** = measured transactions / (first begin -> last commit returned); "
        "**p50 / p99** = begin called -> commit returned.",
        "- **coord req/txn**: requests the transaction coordinator received per measured "
        "transaction, counted by the relay: accepted AddPartitionsToTxn + AddOffsetsToTxn + "
        "EndTxn (mean per transaction in brackets). **in-window CT/txn**: adds the relay "
        "answered CONCURRENT_TRANSACTIONS in the window, also coordinator requests: direct, "
        "the client's own retries; kipside, its begin-hold retries (marked `hold`). "
        "**max accepted adds/txn**: the most accepted adds in any one transaction.",
        "- **AP-AO gap**: per transaction, how far apart the relay saw the first "
        "AddPartitionsToTxn and the first AddOffsetsToTxn. Under 2 x RTT/2 (one relay round "
        "trip) in every transaction means the second was sent before the first's answer could "
        "have come back: `parallel`. Not decidable with RTT 0.",
        "- **CT seen by client**: CONCURRENT_TRANSACTIONS answers the client itself received in "
        "the measured transactions, from its own logs: kafka-python, its TransactionManager "
        "DEBUG records of the decoded responses; librdkafka, its `debug: eos` lines naming the "
        "error, one per AddOffsetsToTxn answer (its second line about the same answer is not "
        "counted) and one per partition of an AddPartitionsToTxn answer (the log's "
        "granularity).",
        f"- One run per cell (no repetitions): {len(runs)} runs, direct and kipside of a cell "
        "back to back.",
        "",
        "### Results",
        "",
        markdown_table(HEADERS, rows(runs), align="lrrlrrrrrrrrr").rstrip(),
        "",
        "### Targets",
        "",
    ]
    for t in targets:
        mark = {"met": "met", "missed": "**MISSED**", "not measured": "not measured"}[t.status]
        lines.append(f"- {t.name}: {mark}: {t.detail}")
    notes = run_notes(runs, waited, skipped, sched)
    if notes:
        lines += ["", "### Notes on this run", "", *(f"- {n}" for n in notes)]
    rel_png = png.relative_to(IMG_DIR.parent) if png.is_relative_to(IMG_DIR.parent) else png
    lines += [
        "",
        f"![Transactions/s direct vs kipside per W and RTT]({rel_png.as_posix()})",
        "",
        "<details><summary>Every run</summary>",
        "",
        markdown_table(DETAIL_HEADERS, detail_rows(runs), align="lrrrrl").rstrip(),
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


DETAIL_HEADERS = [
    "run",
    "wall s",
    "other load (cores)",
    "AP / AO rejected in window (all measured txns)",
    "accepted-AP-AO gap p50 / max ms",
    "client log",
]


def detail_rows(runs: Sequence[Run]) -> list[list[str]]:
    out = []
    for r in runs:
        c = r.coord or Coordinator()
        gaps = (
            f"{_f(percentile(c.accepted_gaps_ms, 50), 2)} / {_f(max(c.accepted_gaps_ms), 2)}"
            if c.accepted_gaps_ms
            else "n/a"
        )
        out.append(
            [
                r.cell.name(),
                f"{r.wall_s:.1f}",
                f"{r.noise_cores:.2f}",
                f"{c.rejected_add_partitions} / {c.rejected_add_offsets}",
                gaps,
                _cut(str(r.data.get("client_detail") or r.error or "").replace("|", "/"), 400),
            ]
        )
    return out


def error_summary(error: str) -> str:
    """The first line of an error and, from a log tail under it, the last line that names an
    error or exception (a traceback's last line is often box drawing or a blank)."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return "`(no message)`"
    named = [ln for ln in lines[1:] if re.search(r"Error|Exception|error:|cannot|refused", ln)]
    out = f"`{lines[0][:300]}`"
    if named:
        out += f" ... `{named[-1][:300]}`"
    return out


def run_notes(
    runs: Sequence[Run],
    waited: tuple[float, float, list[str]],
    skipped: str | None,
    sched: Schedule,
) -> list[str]:
    notes: list[str] = []
    if sched.waited_between >= 1:
        notes.append(
            f"Another benchmark started during this one: paused {sched.waited_between:.0f} s "
            "between cells until it ended (or the wait budget ran out)."
        )
    again = {
        r.cell.name().rsplit(" ", 1)[0]: r.noisy_first for r in runs if r.noisy_first is not None
    }
    if again:
        notes.append(
            f"{len(again)} pair(s) were measured again because other processes kept more than "
            f"{NOISE_CORES} cores busy during the first attempt (only the last attempt counts): "
            + ", ".join(f"{name} ({noise:.2f})" for name, noise in again.items())
        )
    if skipped:
        notes.append(f"kipside was not measured: `{skipped}`")
    if waited[2] or waited[1] >= NOISE_CORES:
        notes.append(
            f"**The machine was busy**: gave up waiting after {waited[0]:.0f} s "
            f"({len(waited[2])} other benchmark process(es) running, {waited[1]:.2f} cores busy "
            "outside this benchmark): numbers are depressed and noisier."
        )
    noisy = [r for r in runs if r.ok and r.noise_cores > NOISE_CORES]
    if noisy:
        notes.append(
            f"{len(noisy)} run(s) shared the machine with other load (> {NOISE_CORES} cores): "
            + ", ".join(f"{r.cell.name()} ({r.noise_cores:.2f})" for r in noisy)
        )
    for r in runs:
        if r.earlier_error is not None:
            notes.append(
                f"{r.cell.name()}: the first attempt failed and the cell was measured again: "
                f"{error_summary(r.earlier_error)}"
            )
        if r.error is not None:
            notes.append(f"{r.cell.name()} failed: {error_summary(r.error)}")
        if r.ok and r.coord is not None and r.coord.transactions != r.data["transactions"]:
            notes.append(
                f"{r.cell.name()}: the relay saw {r.coord.transactions} EndTxn in the measured "
                f"window for {r.data['transactions']} measured transactions"
            )
        if r.coord is not None and r.coord.aborts:
            notes.append(
                f"{r.cell.name()}: {r.coord.aborts} EndTxn(abort) upstream in the measured "
                "window (the loop never aborts)"
            )
        if r.ok and r.coord is not None and r.coord.without_both:
            notes.append(
                f"{r.cell.name()}: {r.coord.without_both} transaction(s) without both an "
                "AddPartitionsToTxn and an AddOffsetsToTxn upstream"
            )
        if r.kipside_exit not in (None, 0):
            notes.append(f"{r.cell.name()}: kipside exited with {r.kipside_exit} on SIGTERM")
        for problem in r.log_problems[:3]:
            notes.append(f"{r.cell.name()}: kipside logged `{problem[:300]}`")
        if len(r.log_problems) > 3:
            notes.append(f"{r.cell.name()}: ... {len(r.log_problems) - 3} more kipside log lines")
        for problem in r.relay_problems[:3]:
            notes.append(f"{r.cell.name()}: the relay reported `{problem[:300]}`")
        if r.metrics_mismatch:
            notes.append(f"{r.cell.name()}: {r.metrics_mismatch}")
        if r.ok and r.data.get("client_concurrent_warmup") and r.cell.path == "kipside":
            notes.append(
                f"{r.cell.name()}: {r.data['client_concurrent_warmup']} CONCURRENT_TRANSACTIONS "
                "reached the client in the warm-up transactions"
            )
    return notes


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--transactions", type=int, default=150, help="most measured per run")
    ap.add_argument("--seconds", type=float, default=8.0, help="most measured time per run")
    ap.add_argument("--windows", default="20,50,200", help="marker windows W, ms")
    ap.add_argument("--rtts", default="0,5", help="client side <-> broker side RTTs, ms")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument(
        "--wait-others",
        type=float,
        default=600.0,
        help="first wait up to this many s for other benchmarks to end and the machine to idle",
    )
    ap.add_argument(
        "--quiet-wait", type=float, default=2.0, help="before each run, wait up to this for idle"
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=330.0,
        help="measure a pair again after other load only while the matrix took less than this (s)",
    )
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--png", type=Path, default=IMG_DIR / "txn.png")
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file to write")
    args = ap.parse_args(argv)
    args.windows = [float(x) for x in args.windows.split(",") if x.strip()]
    args.rtts = [float(x) for x in args.rtts.split(",") if x.strip()]
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if set(args.clients) - set(CLIENTS):
        ap.error(f"clients: choose from {', '.join(CLIENTS)}")
    if set(args.paths) - set(PATHS):
        ap.error(f"paths: choose from {', '.join(PATHS)}")
    if args.transactions < 1 or args.seconds <= 0:
        ap.error("--transactions and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_cleanly_on_sigterm()
    waited = wait_for_machine(args.wait_others)
    if waited[2] or waited[1] >= NOISE_CORES:
        print(
            f"machine still busy after {waited[0]:.0f} s ({len(waited[2])} other benchmark "
            f"process(es), {waited[1]:.2f} cores): measuring anyway",
            file=sys.stderr,
        )
    started = utc_now()
    load = os.getloadavg()[0]
    t_start = time.monotonic()
    skipped: str | None = None
    paths = list(args.paths)
    if "kipside" in paths:
        ok, why = kipside_available()
        if not ok:
            print(f"kipside serve is not usable, skipping it: {why}", file=sys.stderr)
            skipped = why
            paths.remove("kipside")
    runs: list[Run] = []
    sched = Schedule(wait_left=max(0.0, args.wait_others - waited[0]))
    with tempfile.TemporaryDirectory(prefix="kipbench-txn-") as tmp:
        flip = False
        for client in args.clients:
            for rtt in args.rtts:
                for window in args.windows:
                    cells = [Cell(client, window, rtt, p) for p in paths]
                    runs += measure_pair(cells[::-1] if flip else cells, args, Path(tmp), sched)
                    flip = not flip
    wall = time.monotonic() - t_start
    order_key = {p: i for i, p in enumerate(PATHS)}
    runs.sort(
        key=lambda r: (
            args.clients.index(r.cell.client),
            r.cell.rtt_ms,
            r.cell.window_ms,
            order_key[r.cell.path],
        )
    )
    targets = evaluate(runs, args.clients)
    print(f"\n{len(runs)} runs in {wall:.0f} s\n")
    print(text_table(HEADERS, rows(runs)))
    for t in targets:
        print(f"{t.status.upper():>12}  {t.name}: {t.detail}")
    for note in run_notes(runs, waited, skipped, sched):
        print(f"{'NOTE':>12}  {note}")
    if not args.no_doc:
        chart(runs, args, args.png)
        body = section(args, runs, targets, args.png, started, wall, waited, load, skipped, sched)
        doc = write_section(SECTION, body, doc=args.doc)
        print(f"\nwrote {doc} and {args.png}")
    return 0


@dataclass
class Schedule:
    """Time spent waiting for other benchmarks and measuring, across the whole matrix."""

    wait_left: float
    waited_between: float = 0.0
    measuring_s: float = 0.0

    def wait_for_others(self, limit: float) -> None:
        limit = min(limit, self.wait_left)
        if limit <= 0 or not other_benchmarks():
            return
        waited, _busy, _others = wait_for_machine(limit)
        self.wait_left -= waited
        self.waited_between += waited


def measure_pair(
    cells: Sequence[Cell], args: argparse.Namespace, tmp: Path, sched: Schedule
) -> list[Run]:
    """Direct and kipside of one (client, W, RTT), back to back; measured again (once, within
    --budget) when other load ran during either. The last attempt counts."""
    sched.wait_for_others(sched.wait_left)
    t0 = time.monotonic()
    runs = [measure_once(cell, args, tmp, 1) for cell in cells]
    sched.measuring_s += time.monotonic() - t0
    noise = max(r.noise_cores for r in runs)
    if noise > NOISE_CORES and sched.measuring_s + (time.monotonic() - t0) <= args.budget:
        print(
            f"other load ({noise:.2f} cores) during that pair: measuring it again", file=sys.stderr
        )
        sched.wait_for_others(60.0)
        wait_until_quiet(max_busy_cores=NOISE_CORES, timeout=10.0)
        t0 = time.monotonic()
        runs = [measure_once(cell, args, tmp, 3) for cell in cells]
        sched.measuring_s += time.monotonic() - t0
        for run in runs:
            run.noisy_first = noise
    return runs


def measure_once(cell: Cell, args: argparse.Namespace, tmp: Path, attempt: int) -> Run:
    """One run; a failed one is measured again at once (a port taken between choosing and
    binding it, say), and the failure stays in the notes."""
    run = measure(cell, args, tmp, attempt)
    _progress(run)
    if not run.ok:
        retried = measure(cell, args, tmp, attempt + 1)
        retried.earlier_error = run.error
        run = retried
        _progress(run)
    return run


def _progress(run: Run) -> None:
    head = f"{run.cell.name():40s}"
    if not run.ok:
        print(f"{head} FAILED ({run.wall_s:.1f} s)\n{run.error}", file=sys.stderr)
        return
    c = run.coord or Coordinator()
    print(
        f"{head} {run.data['transactions']:4d} txns {run.txn_per_s:7.1f}/s "
        f"p50 {run.latency(50):6.1f} ms p99 {run.latency(99):6.1f} ms "
        f"coord {c.per_txn(c.accepted):.2f}+{c.per_txn(c.rejected):.2f} CT-client "
        f"{run.data['client_concurrent']} other load {run.noise_cores:.2f} ({run.wall_s:.1f} s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
