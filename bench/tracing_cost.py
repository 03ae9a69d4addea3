"""What OpenTelemetry tracing costs kipside: the same workloads with tracing off and on.

One run, same machine: for each repetition, kipside with no exporter (tracing off: no spans are
created) and kipside exporting every Produce/Fetch/transaction span over OTLP http/protobuf to a
local sink that accepts and discards them, each in front of a fresh Tansu. Workloads are
bench/throughput.py's (latency probe, saturated producer, consumer). Loopback only.

    .venv/bin/python bench/tracing_cost.py [--repeats 3] [--seconds 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import HarnessError, open_stack, wait_until_quiet
from _report import (
    command_line,
    facts_markdown,
    machine_info,
    markdown_table,
    text_table,
    utc_now,
    versions,
    write_section,
)
from throughput import PROBE_MESSAGES, PROBE_RATE, Run, _measure_on

CONFIGS = ("tracing off", "tracing on (OTLP)")


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts every export and keeps only counts."""

    received = 0
    bytes_received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        type(self).received += 1
        type(self).bytes_received += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    args.probe_messages, args.probe_rate = PROBE_MESSAGES, PROBE_RATE
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    runs: dict[str, list[Run]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="kiptrace-") as tmp:
        for rep in range(1, args.repeats + 1):
            for config in CONFIGS:
                extra = ["--otlp-endpoint", endpoint] if config != CONFIGS[0] else []
                wait_until_quiet(timeout=120)
                run = Run(config, rep)
                logdir = Path(tmp) / f"{rep}-{len(extra)}"
                logdir.mkdir()
                try:
                    with open_stack("kipside", logdir=logdir, kipside_args=extra) as stack:
                        _measure_on(stack, run, args)
                except HarnessError as exc:
                    run.error = str(exc)
                runs[config].append(run)
                print(f"rep {rep} {config}: {run.metrics or run.error}", flush=True)
    sink.shutdown()

    def med(config: str, key: str) -> float:
        values = [r.metrics[key] for r in runs[config] if r.error is None]
        return statistics.median(values) if values else float("nan")

    headers = [
        "kipside",
        "produce msgs/s",
        "probe p50 / p99 ms",
        "consume msgs/s",
        "kipside CPU us/msg",
        "kipside CPU us per probe request",
    ]
    rows = [
        [
            c,
            f"{med(c, 'prod_msgs'):,.0f}",
            f"{med(c, 'probe_p50'):.3f} / {med(c, 'probe_p99'):.3f}",
            f"{med(c, 'cons_msgs'):,.0f}",
            f"{med(c, 'proxy_us_msg'):.3f}",
            f"{med(c, 'proxy_us_req'):.1f}",
        ]
        for c in CONFIGS
    ]
    off, on = CONFIGS
    cost = [
        "- produce throughput with tracing on: "
        f"{med(on, 'prod_msgs') / med(off, 'prod_msgs'):.2f}x of tracing off",
        "- consume throughput with tracing on: "
        f"{med(on, 'cons_msgs') / med(off, 'cons_msgs'):.2f}x of tracing off",
        f"- added probe p50: {med(on, 'probe_p50') - med(off, 'probe_p50'):+.3f} ms; kipside CPU "
        f"per probe request {med(on, 'proxy_us_req') - med(off, 'proxy_us_req'):+.1f} us",
        f"- the sink received {_Sink.received} OTLP exports, {_Sink.bytes_received / 1e6:.1f} MB",
        "- tracing off creates no spans at all; its cost is one attribute check per request "
        "(the 'tracing off' row is plain kipside)",
    ]
    print(text_table(headers, rows))
    print("\n".join(cost))
    errors = [f"{r.path} rep {r.rep}: {r.error}" for c in CONFIGS for r in runs[c] if r.error]
    if not args.no_doc:
        body = "\n".join(
            [
                "## Tracing cost: kipside with tracing off vs on",
                "",
                "Written by `bench/tracing_cost.py`. Same workloads as the throughput section "
                "(one confluent-kafka client, 100 B records; probe at 1000 msgs/s, linger.ms=0; "
                "saturated producer with linger.ms=5; consumer), kipside in front of a fresh "
                "Tansu per run; tracing on = `--otlp-endpoint` to a local OTLP/HTTP sink that "
                "accepts and discards, every Produce and Fetch request traced (the default "
                "`tracing.api_keys`). Median of the repetitions, configurations interleaved.",
                "",
                facts_markdown(command_line(), utc_now(), machine_info(), versions(haproxy=None)),
                "",
                markdown_table(headers, rows, "lrrrrr"),
                "",
                *cost,
                *(["", "Failed runs:", *[f"- {e}" for e in errors]] if errors else []),
            ]
        )
        write_section("tracing", body)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
