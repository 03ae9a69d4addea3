"""The soak: kipside under steady mixed load for --minutes, its RSS and open file descriptors
sampled every --sample seconds; both must stay flat.

    .venv/bin/python bench/soak.py [--minutes 30] [--sample 5] [--ref REF] [--quick] [--doc FILE]

The load (bench/_soak_load.py, its own process): idempotent confluent-kafka producers at a
steady rate on one topic, coalesced on kipside's lanes; a transactional writer whose
transactional id a transactions rule matches (pre-registration, the begin hold); a consumer
group reading the producers' topic, committing as it goes. kipside runs in front of a fresh
Tansu, with its admin endpoint for the gauges. At the end the load's clients are audited
against the log read from the broker itself. The section is written into docs/reliability.md
(its Soak section) unless --doc says otherwise. Loopback only.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _chart import Lines
from _harness import REPO, HarnessError, KipsideCode, Stack, at_ref, open_stack, snapshot
from _measure import WORKLOAD, run_json, sampling
from _report import DOC, Report, Table, Target, facts, parse_args
from integration.fault_kit.stack import transaction_rules
from testkit import procs
from testkit.metrics import scrape
from testkit.ports import free_port

SOAK_LOAD = REPO / "bench" / "_soak_load.py"
RELIABILITY = REPO / "docs" / "reliability.md"
OPTIONS = {
    "--minutes": (float, 30.0, "how long the load runs"),
    "--sample": (float, 5.0, "seconds between samples of kipside's RSS and descriptors"),
    "--producers": (int, 4, "idempotent producers"),
    "--rate": (float, 50.0, "records a second, per producer"),
    "--members": (int, 2, "consumers in the group"),
    "--partitions": (int, 4, "partitions per topic"),
    "--txn-pause": (float, 0.2, "seconds between transactions"),
    "--ref": (str, "", "run kipside as of this git ref (default: a snapshot of the working tree)"),
}
QUICK = {"minutes": 1.0, "sample": 2.0}
WARM_UP = 0.1  # the first tenth of the run (at most 3 minutes) is warm-up: not judged
RSS_GROWTH_MIB = 10.0  # after warm-up, at most this much more at the end than at its start
FDS_DRIFT = 4  # descriptors: the end within this many of warm-up's end
MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    minute: float
    rss_mib: float
    fds: int
    connections: float
    cpu_s: float


def slope_per_hour(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (minutes), per hour."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


# ---- the run: a fresh stack, the load in its own process, kipside sampled ---------------------

# The load's topics, groups and transactional id; the transactions rule matches txn_topic.
NAMES = {
    "topic": "soak",
    "txn_topic": "soak-txn",
    "txn_input": "soak-in",
    "group": "soak-group",
    "txn_group": "soak-txn-group",
    "txn_id": "soak-writer",
}


def kipside_args(logdir: Path, admin: int) -> list[str]:
    """kipside's command line: the transactions rule (no hold limit) and the admin endpoint."""
    rule_file = logdir / "rules.yaml"
    rule = ("soak-*", NAMES["txn_topic"], NAMES["txn_group"])
    rule_file.write_text(transaction_rules(rule, hold_max_ms=None))
    return ["--rules", str(rule_file), "--admin", f"127.0.0.1:{admin}"]


def create_topics(bootstrap: str, partitions: int) -> None:
    common = {"bootstrap": bootstrap, "partitions": partitions}
    topics = [NAMES["topic"], NAMES["txn_topic"]]
    run_json(WORKLOAD, "create-topics", json.dumps({**common, "topics": topics}), timeout=60)
    one = {**common, "topics": [NAMES["txn_input"]], "partitions": 1}
    run_json(WORKLOAD, "create-topics", json.dumps(one), timeout=60)


def start_load(args: Any, stack: Stack, logdir: Path) -> subprocess.Popen[str]:
    """bench/_soak_load.py in its own process, returned once it says READY."""
    load_args = {
        **NAMES,
        "bootstrap": stack.bootstrap,
        "partitions": args.partitions,
        "direct": f"127.0.0.1:{stack.broker_port}",
        "seconds": args.minutes * 60,
        "producers": args.producers,
        "rate": args.rate,
        "members": args.members,
        "txn_pause": args.txn_pause,
    }
    load = procs.track(
        subprocess.Popen(
            [sys.executable, str(SOAK_LOAD), json.dumps(load_args)],
            stdout=subprocess.PIPE,
            stderr=(logdir / "load.log").open("wb"),
            text=True,
        )
    )
    assert load.stdout is not None
    ready = load.stdout.readline().strip()
    if ready != "READY":
        raise HarnessError(f"the soak's load did not start: {ready!r}, see {logdir}/load.log")
    return load


def sampler(process: psutil.Process, admin: int, samples: list[Sample]) -> Callable[[], None]:
    """What `sampling` calls every --sample seconds: one Sample of kipside appended."""
    started = time.monotonic()
    lock = threading.Lock()

    def sample() -> None:
        with process.oneshot():
            cpu = process.cpu_times()
            found = Sample(
                (time.monotonic() - started) / 60,
                process.memory_info().rss / MIB,
                process.num_fds(),
                scrape(admin).value("kipside_client_connections", float("nan")),
                cpu.user + cpu.system,
            )
        with lock:
            samples.append(found)

    return sample


def load_outcome(load: subprocess.Popen[str], logdir: Path) -> dict[str, Any]:
    """The load's audit (its last JSON line), once it has stopped and exited cleanly."""
    out, _ = load.communicate(timeout=900)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if load.returncode != 0 or not lines:
        raise HarnessError(f"the soak's load failed ({load.returncode}), see {logdir}")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def soak(args: Any, logdir: Path, code: KipsideCode) -> tuple[list[Sample], dict[str, Any]]:
    admin = free_port()
    command = kipside_args(logdir, admin)
    samples: list[Sample] = []
    with open_stack("kipside", logdir, kipside_args=command, code=code) as stack:
        assert stack.proxy is not None
        process = psutil.Process(stack.proxy.popen.pid)
        create_topics(stack.bootstrap, args.partitions)
        load = start_load(args, stack, logdir)
        assert load.stdout is not None
        with sampling(args.sample, sampler(process, admin, samples)):
            stopping = load.stdout.readline().strip()  # after --minutes of steady load
        if stopping != "STOPPING":
            raise HarnessError(f"the soak's load ended early: {stopping!r}, see {logdir}/load.log")
        return samples, load_outcome(load, logdir)


# ---- the report: samples, the load's audit, the targets -------------------------------------


def sample_table(args: Any, samples: list[Sample]) -> Table:
    """About a dozen rows of the samples; CPU % over each row's interval."""
    every = max(1, len(samples) // 12)
    rows = [
        [
            f"{s.minute:.1f}",
            f"{s.rss_mib:.1f}",
            str(s.fds),
            f"{s.connections:.0f}",
            f"{100 * (s.cpu_s - p.cpu_s) / max(60 * (s.minute - p.minute), 1e-9):.0f}",
        ]
        for i, (p, s) in enumerate(itertools.pairwise(samples), start=1)
        if i % every == 0 or i == len(samples) - 1
    ]
    return Table(
        f"kipside every {args.sample * every:g} s (of {len(samples)} samples)",
        ["minute", "RSS MiB", "open fds", "client connections", "kipside CPU %"],
        rows,
    )


def load_table(args: Any, outcome: dict[str, Any]) -> Table:
    return Table(
        "What the load's clients were told, audited against the log",
        ["load", "result"],
        [
            [f"{args.producers} idempotent producers, {args.rate:g}/s each", outcome["produce"]],
            [
                f"transactional writer ({outcome['transactions']} transactions, "
                f"{outcome['txn_aborted']} aborted)",
                f"{outcome['txn']}; group offset {outcome['txn_group_offset']}",
            ],
            [
                f"consumer group of {args.members}",
                f"processed {outcome['group_processed']}, again {outcome['group_reprocessed']}, "
                f"committed {outcome['group_committed']}, assignments "
                f"{outcome['group_rebalances']}",
            ],
        ],
        align="ll",
    )


def soak_targets(judged: list[Sample], outcome: dict[str, Any]) -> list[Target]:
    """RSS and descriptors flat after warm-up (`judged`); the load's clients audited clean."""
    first, last = judged[0], judged[-1]
    growth = last.rss_mib - first.rss_mib
    rss_slope = slope_per_hour([s.minute for s in judged], [s.rss_mib for s in judged])
    fd_values = [s.fds for s in judged]
    return [
        Target(
            f"RSS flat (at most {RSS_GROWTH_MIB:g} MiB more at the end than after warm-up)",
            growth <= RSS_GROWTH_MIB,
            f"{first.rss_mib:.1f} MiB at minute {first.minute:.1f}, {last.rss_mib:.1f} MiB at "
            f"minute {last.minute:.1f} ({growth:+.1f} MiB; least-squares slope "
            f"{rss_slope:+.2f} MiB/hour; range {min(s.rss_mib for s in judged):.1f} to "
            f"{max(s.rss_mib for s in judged):.1f})",
        ),
        Target(
            f"open file descriptors flat (the end within {FDS_DRIFT} of warm-up's end)",
            abs(last.fds - first.fds) <= FDS_DRIFT,
            f"{first.fds} after warm-up, {last.fds} at the end (range {min(fd_values)} to "
            f"{max(fd_values)})",
        ),
        Target(
            "every acknowledged message in the log once, in order; group offsets right",
            outcome["produce_clean"]
            and outcome["txn_clean"]
            and outcome["txn_group_offset"] == outcome["transactions"]
            and not outcome["errors"],
            f"{outcome['produce']}; transactions {outcome['txn']}; errors {outcome['errors']}",
        ),
    ]


def soak_chart(args: Any, samples: list[Sample]) -> tuple[str, list[Lines]]:
    minutes = [s.minute for s in samples]
    return (
        f"kipside over a {args.minutes:g}-minute soak",
        [
            Lines("RSS (MiB)", minutes, {"RSS": [s.rss_mib for s in samples]}, "minutes"),
            Lines("open file descriptors", minutes, {"fds": [s.fds for s in samples]}, "minutes"),
        ],
    )


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    if args.doc == DOC:
        args.doc = RELIABILITY
    logdir = Path(tempfile.mkdtemp(prefix="soak-"))
    code = at_ref(args.ref, logdir / "code") if args.ref else snapshot(logdir / "code")
    samples, outcome = soak(args, logdir, code)
    warm = min(WARM_UP * args.minutes, 3.0)
    targets = soak_targets([s for s in samples if s.minute >= warm], outcome)
    more = (
        f"Load: {args.minutes:g} minutes; {args.producers} idempotent producers at "
        f"{args.rate:g} records/s each, a transactional writer (a transaction every "
        f"{args.txn_pause:g} s, 10 records), a consumer group of {args.members}; samples every "
        f"{args.sample:g} s; minutes before {warm:.1f} are warm-up."
    )
    found = facts(more, code={"kipside code": code.label})
    tables = [sample_table(args, samples), load_table(args, outcome)]
    notes = [f"Logs: {logdir}"]
    chart = soak_chart(args, samples)
    Report("soak", "Soak", found, tables, targets, notes, lines=chart).publish(args)
    return 0 if all(t.ok for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
