"""A fleet of producers on a stack (`_workload.py fleet` processes), and what it measured.

The processes connect and warm up, print READY, wait for GO, run, print FINISHED, then print
their JSON result. `fleet()` lets them all GO at once and returns the numbers of the window
between GO and the last FINISHED: records, rates, delivery latency, Produce requests (the
clients' own count; through kipside also kipside's /metrics, received and sent upstream), CPU
seconds per million records of the broker, the proxy and the clients (= CPU us per record).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from _harness import HarnessError, Stack
from _measure import WORKLOAD, Window, percentile, worker
from testkit import procs
from testkit.metrics import scrape

NAN = float("nan")


class StagedWorker:
    """One staged load process (READY, GO, FINISHED, then JSON) and its stdout lines."""

    def __init__(self, args: dict[str, Any], log: Path) -> None:
        self.log, self.lines = log, queue.Queue[str | None]()
        with log.open("wb") as err:
            command = [sys.executable, str(WORKLOAD), "fleet", json.dumps(args)]
            pipe, env = subprocess.PIPE, dict(os.environ, PYTHONUNBUFFERED="1")
            self.popen = subprocess.Popen(
                command, stdin=pipe, stdout=pipe, stderr=err, text=True, env=env
            )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.popen.stdout or ():
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, deadline: float) -> str:
        """The next stdout line, which must start with `word`."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = "nothing in time"
        if line is None or not line.startswith(word):
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])
            raise HarnessError(f"a load process printed {line!r}, expected {word}:\n{tail}")
        return line

    def go(self) -> None:
        if self.popen.stdin is not None:
            self.popen.stdin.write("GO\n")
            self.popen.stdin.flush()


def run_staged(
    stack: Stack,
    loads: Sequence[dict[str, Any]],
    seconds: float,
    during: AbstractContextManager[object] | None = None,
) -> tuple[list[dict[str, Any]], Window]:
    """Start one staged worker per load, let all GO at once; their results and the window.
    `during` is entered at GO and left once all finished (a profiler, a sampler). Each
    result's `cpu_s` must be its worker's CPU seconds in the window."""
    workers = [StagedWorker(a, stack.logdir / f"load-{i}.log") for i, a in enumerate(loads)]
    try:
        for w in workers:
            w.expect("READY", time.monotonic() + 90)
        stack.check_alive()
        window = Window.of(stack).open()
        for w in workers:
            w.go()
        with during if during is not None else contextlib.nullcontext():
            for w in workers:
                w.expect("FINISHED", time.monotonic() + seconds * 1.5 + 60)
        window.close()
        results = [json.loads(w.expect("{", time.monotonic() + 30)) for w in workers]
    finally:
        for w in workers:
            procs.stop(w.popen, 1.0)
    return results, window


def produce_requests(admin: int | None) -> tuple[float, float]:
    """Produce requests kipside received from clients and sent upstream so far."""
    if admin is None:
        return 0.0, 0.0
    m = scrape(admin)
    client = m.value("kipside_client_requests_total", 0.0, api="Produce")
    return client, m.value("kipside_upstream_requests_total", 0.0, api="Produce")


def fleet(
    stack: Stack,
    load: dict[str, Any],
    counts: list[int],
    *,
    partitions: int,
    admin: int | None = None,
    during: AbstractContextManager[object] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`counts[i]` producers in process i, on a fresh topic `load["topic"]`; the numbers of
    the window and each process's result. `admin`: kipside's admin port, for its counts."""
    topics = {"bootstrap": stack.bootstrap, "topics": [load["topic"]], "partitions": partitions}
    worker(stack, "create-topics", topics)
    common = {"bootstrap": stack.bootstrap, "size": 100, "go_timeout": 120, **load}
    loads = [
        {**common, "producers": n, "first_index": sum(counts[:i])} for i, n in enumerate(counts)
    ]
    before = produce_requests(admin)
    results, w = run_staged(stack, loads, float(load["seconds"]), during)
    after = produce_requests(admin)
    total = {k: sum(r[k] for r in results) for k in ("offered", "delivered", "errors", "cpu_s")}
    stats = float(sum(r["client_produce_requests"] for r in results))
    client, upstream = (after[0] - before[0], after[1] - before[1]) if admin else (stats, stats)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    lat = [v / 1000 for r in results for v in r["latencies_us"]]
    proxy, broker = w.proxy_broker(stack)
    per_m = 1e6 / max(total["delivered"], 1)
    found = {**{k: float(v) for k, v in total.items()}}
    found |= {"msgs_per_s": total["delivered"] / span if span > 0 else 0.0}
    found |= {"p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "client_reqs": client}
    found |= {"client_reqs_stats": stats, "upstream_reqs": upstream}
    found |= {"ratio": client / upstream if upstream else NAN}
    found |= {"msgs_per_upstream_req": total["delivered"] / upstream if upstream else NAN}
    found |= {"broker_cpu_s": broker, "broker_cpu_per_m": broker * per_m}
    found |= {"proxy_cpu_s": proxy if stack.proxy else NAN}
    found |= {"proxy_cpu_per_m": proxy * per_m if stack.proxy else NAN}
    found |= {"both_cpu_per_m": (proxy + broker) * per_m}
    found |= {"client_cpu_per_m": total["cpu_s"] * per_m, "reqs_per_record": stats * per_m / 1e6}
    found |= {"noise_cores": w.noise_cores(total["cpu_s"])}
    return found, results
