"""A fleet of producers (bench/_producers.py processes) on a stack, and what it measured.

`fleet()` starts the processes, lets them all GO at once and returns the numbers of the window
between GO and the last FINISHED: records, rates, delivery latency, Produce requests (the
clients' own count; through kipside also kipside's /metrics, received and sent upstream), CPU
seconds per million records of the broker, the proxy and the clients (= CPU us per record).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from _harness import REPO, Stack
from _measure import percentile, run_staged, worker
from testkit.metrics import scrape

SCRIPT = REPO / "bench" / "_producers.py"
NAN = float("nan")


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
    results, w = run_staged(stack, SCRIPT, loads, float(load["seconds"]), during)
    after = produce_requests(admin)
    total = {k: sum(r[k] for r in results) for k in ("offered", "delivered", "errors", "cpu_s")}
    stats = float(sum(r["client_produce_requests"] for r in results))
    client, upstream = (after[0] - before[0], after[1] - before[1]) if admin else (stats, stats)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    lat = [v / 1000 for r in results for v in r["latencies_us"]]
    proxy, broker = w.proxy_broker(stack)
    per_m = 1e6 / max(total["delivered"], 1)
    return {
        **{k: float(v) for k, v in total.items()},
        "msgs_per_s": total["delivered"] / span if span > 0 else 0.0,
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "client_reqs": client,
        "client_reqs_stats": stats,
        "upstream_reqs": upstream,
        "ratio": client / upstream if upstream else NAN,
        "msgs_per_upstream_req": total["delivered"] / upstream if upstream else NAN,
        "broker_cpu_s": broker,
        "broker_cpu_per_m": broker * per_m,
        "proxy_cpu_s": proxy if stack.proxy else NAN,
        "proxy_cpu_per_m": proxy * per_m if stack.proxy else NAN,
        "both_cpu_per_m": (proxy + broker) * per_m,
        "client_cpu_per_m": total["cpu_s"] * per_m,
        "reqs_per_record": stats * per_m / 1e6,
        "noise_cores": w.noise_cores(total["cpu_s"]),
    }, results
