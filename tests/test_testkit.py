"""tests/testkit: the /metrics parser, the port wait and the CPU reader the suites and the
benchmarks share (no broker: a Python child process stands in where one is needed)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from testkit import tools
from testkit.cpu import tree_cpu_seconds
from testkit.metrics import parse
from testkit.ports import PortNotListening, free_port, wait_for_port

EXPOSITION = """\
# HELP kipside_client_requests_total Requests received from clients.
# TYPE kipside_client_requests_total counter
kipside_client_requests_total{api="Produce"} 12.0
kipside_client_requests_total{api="Fetch",node="111"} 3.0
kipside_client_requests_total{api="Fetch",node="112"} 4.0
# HELP kipside_upstream_connections Open upstream connections.
# TYPE kipside_upstream_connections gauge
kipside_upstream_connections 2.0
# TYPE kipside_request_latency_seconds histogram
kipside_request_latency_seconds_bucket{api="Produce",le="0.001"} 5.0
kipside_request_latency_seconds_bucket{api="Produce",le="+Inf"} 12.0
kipside_request_latency_seconds_count{api="Produce"} 12.0
kipside_request_latency_seconds_sum{api="Produce"} 0.25
"""


def test_metrics_are_found_by_name_and_a_subset_of_labels() -> None:
    m = parse(EXPOSITION)
    assert m.value("kipside_client_requests_total", api="Produce") == 12
    assert m.value("kipside_client_requests_total", api="Fetch") == 7  # both nodes add up
    assert m.value("kipside_client_requests_total", api="Fetch", node="112") == 4
    assert m.value("kipside_client_requests_total") == 19
    assert m.value("kipside_upstream_connections") == 2
    assert m.value("kipside_request_latency_seconds_bucket", le="+Inf") == 12
    assert m.value("kipside_request_latency_seconds_sum", api="Produce") == 0.25


def test_a_missing_metric_fails_unless_a_default_is_given() -> None:
    m = parse(EXPOSITION)
    with pytest.raises(KeyError, match="kipside_lane_failures_total"):
        m.value("kipside_lane_failures_total")
    with pytest.raises(KeyError):
        m.value("kipside_client_requests_total", api="Metadata")
    assert m.value("kipside_lane_failures_total", 0.0) == 0.0


def test_waiting_for_a_port_fails_at_once_when_its_process_exited() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    proc.wait(timeout=30)
    with pytest.raises(PortNotListening, match="exited with code 7"):
        wait_for_port(free_port(), process=proc, name="the child", timeout=30)


def test_waiting_for_a_port_nobody_opens_times_out() -> None:
    with pytest.raises(PortNotListening, match="nothing is listening"):
        wait_for_port(free_port(), timeout=0.3)


def test_tree_cpu_seconds_counts_a_busy_grandchild() -> None:
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {spin!r}])\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        seen = 0.0
        for _ in range(200):  # the grandchild spins for 0.3 s of CPU, then exits
            seen = max(seen, tree_cpu_seconds(proc.pid))
            if seen >= 0.25:
                break
            time.sleep(0.05)
        assert seen >= 0.25, seen
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert tree_cpu_seconds(proc.pid) == 0.0  # gone: nothing to read


def test_a_missing_tool_skips_naming_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=r"kcat is not installed .*make system-deps"):
        tools.require("kcat")
    with pytest.raises(tools.ToolMissing, match=r"tshark is not installed .*apt-get install"):
        tools.find("tshark")
