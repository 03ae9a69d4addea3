"""What OpenTelemetry tracing costs kipside: bench/throughput.py's workloads, tracing off and on.

    .venv/bin/python bench/tracing_cost.py [--repeats 3] [--seconds 8] [--quick]

Per repetition, kipside with no exporter (no spans are created) and kipside exporting every
Produce/Fetch/transaction span over OTLP http/protobuf to a local sink that accepts and discards
them, each in front of a fresh Tansu. Loopback only.
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _report import Compared, parse_args
from throughput import OPTIONS, QUICK, workloads

OFF, ON = "kipside, tracing off", "kipside, tracing on (OTLP)"
COLUMNS = [
    ("produce msgs/s", "{prod_msgs_per_s:,.0f}"),
    ("probe p50 / p99 ms", "{probe_p50_ms:.3f} / {probe_p99_ms:.3f}"),
    ("consume msgs/s", "{cons_msgs_per_s:,.0f}"),
    ("kipside CPU us/msg", "{proxy_us_msg:.3f}"),
    ("kipside CPU us per probe request", "{probe_proxy_cpu_per_m:.1f}"),
    ("produce, consume vs off", "{prod_msgs_per_s_vs:.2f}x, {cons_msgs_per_s_vs:.2f}x"),
    (
        "added probe p50 ms, CPU us/request",
        "{probe_p50_ms_add:+.3f}, {probe_proxy_cpu_per_m_add:+.1f}",
    ),
]
VS = ["prod_msgs_per_s", "cons_msgs_per_s", "probe_p50_ms", "probe_proxy_cpu_per_m"]
TITLE = "Tracing cost: kipside with tracing off vs on"
RESULTS = {"Results (median of {reps})": COLUMNS}
BENCH = Compared("tracing", TITLE, RESULTS, OFF, VS, first="", retries=0)


class Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts every export and keeps only counts."""

    exports = 0
    size = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        Sink.exports, Sink.size = Sink.exports + 1, Sink.size + length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> int:
    args = parse_args(__doc__, {**OPTIONS, "--messages": (int, 1_000_000, "records")}, QUICK)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    exporter = ["--otlp-endpoint", f"http://127.0.0.1:{sink.server_address[1]}"]
    cases = {
        OFF: partial(workloads, "kipside", args, []),
        ON: partial(workloads, "kipside", args, exporter),
    }
    runs, med = BENCH.run(args, cases)
    sink.shutdown()
    sent = f"The sink received {Sink.exports} OTLP exports, {Sink.size / 1e6:.1f} MB."
    BENCH.report(args, runs, med, notes=[sent]).publish(args)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
