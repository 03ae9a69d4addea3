"""Instructions kipside executes per request (callgrind): the working tree against git refs.

    .venv/bin/python bench/instructions.py [--baseline-refs main] [--requests 200,1200]
        [--modes shared,one-to-one] [--quick]

Wall and CPU time on a shared machine move by tens of percent from run to run; instructions
counted by valgrind's callgrind do not depend on what else runs. Per code (the working tree, a
snapshot; each --baseline-refs ref) and mode (shared lanes: coalesced Produce, a `Take`; and
--one-to-one: the client's own connection, a `ForwardOwn`), kipside runs under callgrind twice
in front of a fresh Tansu while one closed-loop confluent-kafka producer sends N1 and N2
one-record ProduceRequests (each flushed before the next); instructions per request are the
difference of the two runs' totals over N2 - N1, so start-up and shutdown cancel out.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from _harness import HOST, HarnessError, KipsideCode, at_ref, snapshot
from _report import Report, Table, facts, listed, parse_args
from testkit.broker import TANSU_NODE_ID, start_tansu
from testkit.ports import free_port, wait_for_port

MODES = ["shared", "one-to-one"]
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "--baseline-refs": (listed(str), ["main"], "git refs to compare the working tree with"),
    "--requests": (listed(int), [200, 1200], "N1,N2: requests of the two runs"),
    "--modes": (listed(str, MODES), MODES, "a comma-separated subset"),
}
QUICK = {"requests": [20, 70], "modes": ["shared"]}
STARTUP_TIMEOUT = 900.0  # imports under callgrind take minutes on a loaded machine


def instructions(code: KipsideCode, mode: str, requests: int, out: Path) -> int:
    """The instructions kipside `code` executed, from start to exit, serving `requests`."""
    with start_tansu() as broker:
        port, node = free_port(), free_port()
        args = code.command("serve", "--upstream", broker.bootstrap, "--listen")
        args += [f"{HOST}:{port}", "--node-port-base", str(node - TANSU_NODE_ID)]
        args += ["--one-to-one"] if mode == "one-to-one" else []
        grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *args]
        with out.with_suffix(".log").open("wb") as log:
            proc = subprocess.Popen(grind, stdout=log, stderr=log, env=code.env())
        try:
            for listening in (port, node):
                wait_for_port(listening, timeout=STARTUP_TIMEOUT, process=proc, name="kipside")
            producer = ck.Producer({"bootstrap.servers": f"{HOST}:{port}", "linger.ms": 0})
            for _ in range(requests + 1):  # one more: connections and metadata first
                producer.produce("instructions", b"x" * 100, partition=0)
                if producer.flush(120) != 0:
                    raise HarnessError("a record was not delivered within 120 s")
            del producer
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(STARTUP_TIMEOUT)
    summary = subprocess.run(
        ["callgrind_annotate", str(out)], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"([\d,]+) \(100.0%\) +PROGRAM TOTALS", summary)
    if found is None:
        raise HarnessError(f"no totals in {out}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    low, high = args.requests
    tmp = Path(tempfile.mkdtemp(prefix="kipbench-instructions-"))
    codes = {"kipside": snapshot(tmp / "kipside")}
    codes |= {
        f"kipside@{ref}": at_ref(ref, tmp / ref.replace("/", "_")) for ref in args.baseline_refs
    }
    per: dict[tuple[str, str], float] = {}
    for mode in args.modes:
        for name, code in codes.items():
            runs = [
                instructions(code, mode, n, tmp / f"{mode}-{name}-{n}.out") for n in (low, high)
            ]
            per[mode, name] = (runs[1] - runs[0]) / (high - low)
            print(f"{mode} {name}: {per[mode, name]:,.0f} instructions/request", file=sys.stderr)
    rows = [
        [mode, name, f"{per[mode, name]:,.0f}", f"{per[mode, name] / per[mode, 'kipside']:.4f}"]
        for mode in args.modes
        for name in codes
    ]
    headers = ["mode", "code", "instructions per request", "vs the working tree"]
    what = (
        f"Per code and mode: kipside under callgrind, {low:,} and {high:,} closed-loop one-record "
        "ProduceRequests from confluent-kafka; instructions per request = the difference of the "
        f"two totals / {high - low:,}. shared: coalesced Produce on the lanes; one-to-one: "
        "--one-to-one, every request on the client's own connection."
    )
    fx = facts(what, code={name: code.label for name, code in codes.items()})
    table = Table("Instructions per request", headers, rows, "llrr")
    Report("instructions", "Instructions per request (callgrind)", fx, [table]).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
