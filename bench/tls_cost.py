"""What TLS costs kipside: bench/throughput.py's workloads over plaintext, TLS toward clients,
TLS toward brokers, and TLS on both sides, in one run.

    .venv/bin/python bench/tls_cost.py [--repeats 3] [--seconds 8] [--messages 1000000]
                                       [--ref HEAD] [--quick]

kipside runs as of git --ref (every run the same code while others edit the checkout). Per
repetition and case, a fresh Tansu behind haproxy (TCP mode; it terminates TLS, as a TLS
broker's listener would, when kipside speaks TLS to the brokers) and kipside in front of it;
the confluent-kafka clients speak TLS to kipside when it serves TLS. Certificates are made at
run time (trustme, ECDSA P-256). Loopback only. docs/performance.md ("TLS cost") says what each
number measures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

from _harness import HOST, KipsideCode, Managed, at_ref, haproxy, launch
from _report import Compared, parse_args
from relaykit.tls import TestCA
from testkit import procs
from testkit.ports import free_port
from throughput import OPTIONS, QUICK, workloads

CASES = {  # case: (TLS toward clients, TLS toward brokers)
    "plaintext": (False, False),
    "TLS toward clients": (True, False),
    "TLS toward brokers": (False, True),
    "TLS both sides": (True, True),
}
COLUMNS = [
    ("produce msgs/s", "{prod_msgs_per_s:,.0f}"),
    ("consume msgs/s", "{cons_msgs_per_s:,.0f}"),
    ("probe p50 ms", "{probe_p50_ms:.3f}"),
    ("kipside CPU us/msg", "{proxy_us_msg:.3f}"),
    ("vs plaintext", "{proxy_us_msg_vs:.2f}x"),
    ("kipside CPU us/request (probe)", "{probe_proxy_cpu_per_m:.1f}"),
    ("vs plaintext", "{probe_proxy_cpu_per_m_vs:.2f}x"),
    ("haproxy CPU us/msg (excluded)", "{front_us_msg:.3f}"),
]
VS = ["proxy_us_msg", "probe_proxy_cpu_per_m", "prod_msgs_per_s"]
TITLE = "TLS cost: kipside's CPU with TLS toward clients, toward brokers, both, and neither"
RESULTS = {"Results (median of {reps})": COLUMNS}
BENCH = Compared("tls", TITLE, RESULTS, "plaintext", VS, first="", budget=300, tools=["haproxy"])


class Front:
    """haproxy before Tansu, as open_stack's `relay`: Tansu advertises `port`, and setting
    `upstream` (open_stack does, once Tansu runs) starts it; with `pem` it terminates TLS."""

    def __init__(self, logdir: Path, pem: Path | None) -> None:
        self.port, self.logdir, self.pem = free_port(), logdir, pem
        self.process: Managed | None = None

    @property
    def upstream(self) -> tuple[str, int] | None:
        return None

    @upstream.setter
    def upstream(self, address: tuple[str, int]) -> None:
        command = haproxy(self.logdir / "front.cfg", self.port, address[1], self.pem)
        self.process = launch("haproxy", command, self.logdir / "front.log", [self.port])

    def close(self) -> float:
        """Stop it; the CPU seconds it used."""
        if self.process is None:
            return float("nan")
        cpu = self.process.cpu_seconds()
        procs.stop(self.process.popen)
        return cpu


def case(
    tls_clients: bool,
    tls_brokers: bool,
    args: argparse.Namespace,
    code: KipsideCode,
    pki: Path,
    logdir: Path,
) -> dict[str, float]:
    """throughput's workloads through kipside, with TLS on the sides asked for."""
    extra, client = [], {}
    if tls_clients:
        extra += ["--tls-cert", str(pki / "kipside.pem"), "--tls-key", str(pki / "kipside.key")]
        client = {"security.protocol": "SSL", "ssl.ca.location": str(pki / "kipside-ca.pem")}
    if tls_brokers:
        extra += ["--upstream-ca", str(pki / "brokers-ca.pem")]
        extra += ["--upstream-server-name", "broker.test"]
    front = Front(logdir, pki / "broker.pem+key" if tls_brokers else None)
    try:
        found = workloads("kipside", args, extra, logdir, relay=front, client=client, code=code)
    finally:
        front_cpu_s = front.close()
    messages = found["prod_delivered"] + found["cons_messages"]
    return found | {"front_cpu_s": front_cpu_s, "front_us_msg": front_cpu_s / messages * 1e6}


def certificates(directory: Path) -> Path:
    """kipside's certificate (clients trust kipside-ca.pem) and the TLS broker's
    (kipside trusts brokers-ca.pem; haproxy reads certificate and key from one file)."""
    TestCA(directory, "kipside").issue("kipside", HOST, common_name="kipside")
    broker = TestCA(directory, "brokers").issue("broker", "broker.test", HOST)
    (directory / "broker.pem+key").write_bytes(broker.cert.read_bytes() + broker.key.read_bytes())
    return directory


def main() -> int:
    options = {k: v for k, v in OPTIONS.items() if k != "--paths"}
    options |= {"--messages": (int, 1_000_000, "records"), "--ref": (str, "HEAD", "git ref")}
    args = parse_args(__doc__, options, QUICK)
    work = Path(tempfile.mkdtemp(prefix="kipside-tls-bench-"))
    code, pki = at_ref(args.ref, work / "code"), certificates(work)
    cases = {name: partial(case, *sides, args, code, pki) for name, sides in CASES.items()}
    runs, med = BENCH.run(args, cases)
    front = ", ".join(f"{m['front_us_msg']:.3f} us/msg {c}" for c, m in med.items() if m)
    relay = (
        "haproxy stands between kipside and Tansu in every case, terminating TLS (the TLS "
        f"broker) when kipside speaks TLS to the brokers: its CPU, {front} (its whole life per "
        "record), is not in kipside's figures."
    )
    tls = (
        "TLS: TLS 1.3 (kipside and haproxy accept 1.2 and up), ECDSA P-256 certificates made "
        "at run time; kipside's TLS is Python's ssl module (OpenSSL) over memory BIOs."
    )
    code_label = {"kipside code": code.label}
    BENCH.report(args, runs, med, tls, notes=[relay], code=code_label).publish(args)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
