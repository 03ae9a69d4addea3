"""Capture a real run through kipside on both sides: for docs/evidence.md, and the golden files.

    .venv/bin/python tests/captures/capture_run.py coalescing OUT_DIR [--producers N] [--messages N]
    .venv/bin/python tests/captures/capture_run.py transactions OUT_DIR [--transactions N]
                                                   [--window-ms MS]
    .venv/bin/python tests/captures/capture_run.py --golden

A run (tests/captures/scenarios.py) writes OUT_DIR/client.pcap (clients <-> kipside),
OUT_DIR/broker.pcap (kipside <-> the relay in front of Tansu) and OUT_DIR/run.json (what the
relay counted, independently), then prints the tcpdump commands it ran and
`kipside pcap compare` of the two captures.

--golden makes the small runs whose captures tests/captures/test_golden.py reads:
tests/captures/golden/{coalescing,transactions}/, with each capture's `kipside pcap summary
--json` and the two captures' `kipside pcap compare`, the outputs the tests hold the code to.
Run it again only when the traffic or the figures are meant to change, and say why in the
commit. Needs tcpdump (root, or CAP_NET_RAW) and the embedded Tansu.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
GOLDEN = TESTS / "captures" / "golden"
KIPSIDE = REPO / ".venv" / "bin" / "kipside"
GOLDEN_SETTINGS = {
    "coalescing": {"producers": 4, "messages": 40, "partitions": 4},
    "transactions": {"transactions": 5, "partitions": 3},
}

sys.path.insert(0, str(TESTS))


def kipside_pcap(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(KIPSIDE), "pcap", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"kipside pcap {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def run(scenario: str, out: Path, settings: dict[str, Any]) -> None:
    from captures.scenarios import BROKER_PCAP, CLIENT_PCAP, coalescing_run, transaction_run

    if out.exists():
        for name in (CLIENT_PCAP, BROKER_PCAP):
            (out / name).unlink(missing_ok=True)
    maker = coalescing_run if scenario == "coalescing" else transaction_run
    result = maker(out, **settings)
    if any(result.dropped.values()):
        raise SystemExit(f"the kernel dropped packets {result.dropped}: run it again")
    for log in out.glob("*.tcpdump.log"):
        log.unlink()
    shutil.rmtree(out / "kipside", ignore_errors=True)
    (out / "rules.yaml").unlink(missing_ok=True)
    ports = " or ".join(f"tcp port {p}" for p in result.kipside_ports)
    print(f"# {scenario}: {settings}")
    tcpdump = "tcpdump -i lo -s 0 -U --immediate-mode -w"
    print(f"{tcpdump} {out / CLIENT_PCAP} '{ports}'")
    print(f"{tcpdump} {out / BROKER_PCAP} 'tcp port {result.broker_port}'")
    print(f"$ kipside pcap compare {CLIENT_PCAP} {BROKER_PCAP}")
    print(kipside_pcap("compare", CLIENT_PCAP, BROKER_PCAP, cwd=out))


def golden() -> None:
    for scenario, settings in GOLDEN_SETTINGS.items():
        out = GOLDEN / scenario
        out.mkdir(parents=True, exist_ok=True)
        run(scenario, out, settings)
        for side in ("client", "broker"):
            summary = kipside_pcap("summary", f"{side}.pcap", "--json", cwd=out)
            (out / f"summary-{side}.json").write_text(summary)
        compare = kipside_pcap("compare", "client.pcap", "broker.pcap", cwd=out)
        (out / "compare.txt").write_text(compare)
        json.loads((out / "run.json").read_text())  # written by the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", choices=["coalescing", "transactions"])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--golden", action="store_true", help="rewrite tests/captures/golden")
    parser.add_argument("--producers", type=int, default=6)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--transactions", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--window-ms",
        type=float,
        default=50.0,
        help="transactions: how long the relay answers CONCURRENT_TRANSACTIONS after each EndTxn "
        "(Apache Kafka's marker window; 0: none)",
    )
    args = parser.parse_args()
    if args.golden:
        golden()
        return
    if args.scenario is None or args.out is None:
        parser.error("give a scenario and an output folder, or --golden")
    settings: dict[str, Any]
    if args.scenario == "coalescing":
        settings = {"producers": args.producers, "messages": args.messages}
    else:
        settings = {"transactions": args.transactions, "window_ms": args.window_ms}
    run(args.scenario, args.out, {**settings, "partitions": args.partitions})


if __name__ == "__main__":
    main()
