"""Counting cost per request and /metrics scrape cost, before and after the OpenTelemetry SDK.

Compute only (timeit; no broker, no sockets); needs git (the "before" code comes from BEFORE).
Run: .venv/bin/python bench/counting_cost.py [--doc]   (--doc writes docs/performance.md)
"""

from __future__ import annotations

import datetime
import itertools
import os
import platform
import re
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from kipside.protocol import ApiKey, api_name
from kipside.proxy.telemetry.metrics import Metrics
from kipside.proxy.telemetry.stats import Stats

REPO = Path(__file__).resolve().parents[1]
BEFORE = "d9f722b"  # the last commit with the hand-written Prometheus text
APIS = [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, *range(8, 15)]
REQUESTS, SDK_REQUESTS, SCRAPES, REPEAT = 200_000, 10_000, 300, 7
START, END = "<!-- bench:counting:start -->", "<!-- bench:counting:end -->"


def load_before() -> list[Any]:
    """BEFORE's proxy/telemetry stats.py and metrics.py, as modules before_stats, before_metrics."""
    modules = []
    for name in ("stats", "metrics"):
        git = ["git", "-C", str(REPO), "show", f"{BEFORE}:proxy/telemetry/{name}.py"]
        text = subprocess.run(git, capture_output=True, text=True, check=True).stdout
        module = sys.modules[f"before_{name}"] = ModuleType(f"before_{name}")
        code = text.replace("kipside.proxy.telemetry.stats", "before_stats")
        exec(compile(code, f"{BEFORE}:proxy/telemetry/{name}.py", "exec"), module.__dict__)
        modules.append(module)
    return modules


def count_request(stats: Any, api: int = ApiKey.PRODUCE, size: int = 180) -> None:
    stats.client_requests[api] += 1
    stats.client_request_bytes[api] += size
    stats.upstream_requests[api] += 1
    stats.client_response_bytes[api] += size
    stats.observe_latency(api, 0.0007)


def sdk_instruments() -> Callable[[], None]:
    """The same counts through synchronous SDK instruments (whichever reader collects later)."""
    meter = MeterProvider([InMemoryMetricReader()], shutdown_on_exit=False).get_meter("bench")
    requests, upstream = meter.create_counter("requests"), meter.create_counter("upstream")
    frame_bytes, latency = meter.create_counter("bytes"), meter.create_histogram("latency")

    def count(api: int = ApiKey.PRODUCE, size: int = 180) -> None:
        name = api_name(api)
        requests.add(1, {"api": name})
        frame_bytes.add(size, {"api": name, "direction": "request"})
        upstream.add(1, {"api": name})
        frame_bytes.add(size, {"api": name, "direction": "response"})
        latency.record(0.0007, {"api": name})

    return count


def measure() -> list[tuple[str, str, float]]:
    old, old_metrics = load_before()
    before, after, old_busy, new_busy = old.Stats(), Stats(), old.Stats(), Stats()
    for stats, api in itertools.product((old_busy, new_busy), APIS * 50):
        count_request(stats, api)
    count, scrape = "count one request", "scrape /metrics, 10 APIs"
    workloads: list[tuple[str, str, Callable[[], object], int]] = [
        (count, "before", lambda: count_request(before), REQUESTS),
        (count, "after", lambda: count_request(after), REQUESTS),
        (count, "SDK instruments", sdk_instruments(), SDK_REQUESTS),
        (scrape, "before", lambda: old_metrics.render_metrics(old_busy), SCRAPES),
        (scrape, "after", Metrics(new_busy).prometheus_text, SCRAPES),
    ]
    best = [float("inf")] * len(workloads)
    for _ in range(REPEAT):  # interleaved, so a busy moment on a shared machine hits every row
        for k, (_, _, call, n) in enumerate(workloads):
            best[k] = min(best[k], timeit.timeit(call, number=n) / n)
    return [(w, i, seconds) for (w, i, _, _), seconds in zip(workloads, best, strict=True)]


def table(rows: list[tuple[str, str, float]]) -> str:
    head = ["| workload | implementation | us per call |", "|:---|:---|---:|"]
    return "\n".join(head + [f"| {w} | {i} | {s * 1e6:,.2f} |" for w, i, s in rows])


ABOUT = (
    "Written by `bench/counting_cost.py`: timeit, best of {repeat} interleaved rounds. *before*:"
    " kipside at {before} (Stats, hand-written Prometheus text); *after*: Stats now, read by the"
    " OpenTelemetry metrics SDK through observable instruments at collection time, histograms"
    " from Stats' own buckets, /metrics from the SDK's Prometheus reader; *SDK instruments*: the"
    " design not taken, the same counts through Counter.add and Histogram.record per request."
)


def section(rows: list[tuple[str, str, float]]) -> str:
    cpu = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in x)
    machine = f"{os.cpu_count()} CPUs (nproc), {cpu.split(':', 1)[1].strip()}, Linux "
    machine += f"{platform.release()}, Python {platform.python_version()}, load average "
    machine += f"{os.getloadavg()[0]:.1f} (the machine may be shared: compare rows, not runs)"
    return f"""{START}
## Counting cost: metrics through the OpenTelemetry SDK (issue 12)

{ABOUT.format(repeat=REPEAT, before=BEFORE)}

- Command: `.venv/bin/python bench/counting_cost.py --doc`
- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}
- Machine: {machine}

{table(rows)}

- Counting per request runs the same code before and after (their rows differ by noise only); \
SDK instruments would cost {rows[2][2] / rows[1][2]:.0f}x as much, on every request.
- A scrape costs {rows[4][2] / rows[3][2]:.0f}x as much through the SDK, once per scrape: at one \
scrape every 15 s, {rows[4][2] / 15 * 100:.3f}% of a CPU, and the event loop paused that long.
{END}"""


def write_doc(text: str) -> None:
    doc = REPO / "docs" / "performance.md"
    current = doc.read_text()
    if START not in current:
        current = f"{current.rstrip()}\n\n{START}\n{END}\n"
    old = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    doc.write_text(old.sub(lambda _: text, current))


if __name__ == "__main__":
    doc = sys.argv[1:] == ["--doc"]
    if sys.argv[1:] not in ([], ["--doc"]):
        sys.exit(__doc__)
    rows = measure()
    print(table(rows))
    if doc:
        write_doc(section(rows))
        print("wrote the bench:counting section of docs/performance.md")
