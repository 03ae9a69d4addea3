"""The fault suite's scenarios, longer and bigger than in CI: more load, longer outages, more
rounds. The scenarios are the CI suite's own (tests/integration/fault_scenarios/), each run
once at the scale below; every check the CI test asserts is reported here.

    .venv/bin/python bench/faults.py [--scenarios network-produce,storm,...] [--quick] [--doc FILE]

--quick runs each at its CI scale (a smoke test). The section is written into
docs/reliability.md unless --doc says otherwise. Loopback only.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from _harness import REPO  # also puts tests/ on sys.path
from _report import DOC, Report, Table, Target, facts, listed, parse_args
from integration.fault_scenarios import SCENARIOS, run
from integration.fault_scenarios.disconnect import DisconnectScale
from integration.fault_scenarios.latency import LatencyScale
from integration.fault_scenarios.network import GroupScale, NetworkScale, TransactionScale
from integration.fault_scenarios.outcome import Outcome, Producers, Timeouts
from integration.fault_scenarios.restart import RestartScale
from integration.fault_scenarios.storm import StormScale

RELIABILITY = REPO / "docs" / "reliability.md"
LONG = Timeouts(answer_s=5.0, request_ms=10000)  # the network and latency runs' timeouts
BIG: dict[str, Any] = {
    "network-produce": NetworkScale(
        producers=Producers(6, 300.0), cut_s=10.0, blackhole_s=20.0, settle_s=5.0, timeouts=LONG
    ),
    "network-transactions": TransactionScale(writers=4, before_s=5.0, cut_s=10.0, after_s=10.0),
    "network-rebalance": GroupScale(messages=20000, cut_s=10.0),
    "restarts": RestartScale(producers=Producers(4, 300.0), between_s=5.0, down_s=3.0, restarts=3),
    "latency": LatencyScale(
        producers=Producers(4, 300.0),
        spike_ms=2000.0,
        spike_s=10.0,
        stall_s=20.0,
        settle_s=5.0,
        timeouts=LONG,
    ),
    "disconnects": DisconnectScale(rate=300.0, rounds=5),
    "storm": StormScale(connections=5000, slow_readers=32, held_s=30.0),
}
OPTIONS = {
    "--scenarios": (listed(choices=list(SCENARIOS)), list(SCENARIOS), "which scenarios"),
}


def main() -> int:
    args = parse_args(__doc__, OPTIONS, {})
    if args.doc == DOC:
        args.doc = RELIABILITY
    work = Path(tempfile.mkdtemp(prefix="faults-"))
    rows, targets, notes = [], [], []
    for scenario in args.scenarios:
        scale = None if args.quick else BIG[scenario]
        started = time.monotonic()
        tag = uuid.uuid4().hex[:8]

        def name(prefix: str, tag: str = tag) -> str:
            return f"{prefix}-{tag}"

        try:
            outcome = run(scenario, work / scenario, name, scale)
        except Exception as exc:  # one failed scenario must not lose the others
            notes.append(f"`{scenario}` failed: {exc!r}")
            print(traceback.format_exc(), file=sys.stderr)
            outcome = Outcome("-", "-", f"failed: {type(exc).__name__}")
            outcome.check("ran to the end", False, repr(exc))
        seconds = time.monotonic() - started
        failed = [f"{c.what} ({c.detail[:200]})" for c in outcome.checks if not c.ok]
        passed = len(outcome.checks) - len(failed)
        detail = f"{passed} of {len(outcome.checks)} passed" + (
            ": failed " + "; ".join(failed) if failed else ""
        )
        row = [scenario, outcome.load, outcome.faults, outcome.result, detail, f"{seconds:.0f}"]
        rows.append(row)
        targets.append(Target(f"{scenario}: every check of the CI test", outcome.ok, detail))
    table = Table(
        "Scenarios, each run once",
        ["scenario", "load held", "faults injected", "result", "checks of the CI test", "seconds"],
        rows,
        align="llllll",
    )
    scale = "at their CI scale (--quick)" if args.quick else "at the scale in bench/faults.py"
    more = f"Scenarios {scale}; logs under {work}."
    found = facts(more)
    Report("faults", "Longer fault runs", found, [table], targets, notes).publish(args)
    return 0 if all(t.ok for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
