"""`kipside pcap` on traffic captured now, by tcpdump, on both sides of a running kipside.

A coalescing run (six confluent-kafka producers with acks all, 1 and 0 and idempotence, one
aiokafka producer, through kipside's lanes) and a transaction run (a confluent-kafka
transactional producer, kipside pre-registering and holding through the marker-window relay's
CONCURRENT_TRANSACTIONS), each captured between the clients and kipside and between kipside and
the relay (tests/captures/scenarios.py). The summaries must equal, exactly, what the relay counted
(broker side) and what kipside counted (client side), and tshark's Kafka dissector must read the
same requests per API and Produce partitions. A capture the kernel dropped packets from is a
failed run, not a pass.

Run: .venv/bin/pytest tests/captures/test_captured_runs.py -q -p no:cacheprovider
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import skip_unless_shared_lanes
from testkit import tools

from captures.checks import assert_broker_side, assert_client_side, assert_tshark_agrees
from captures.scenarios import BROKER_PCAP, CLIENT_PCAP, Run, coalescing_run, transaction_run
from kipside.evidence import compare

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _needs_tools_and_lanes() -> None:
    skip_unless_shared_lanes("coalescing and transaction pre-registration")
    tools.require("tcpdump", "captures kipside's traffic on loopback")
    tools.require("tshark", "its Kafka dissector cross-checks kipside pcap's")


def check(run: Run, workdir: Path) -> None:
    assert run.dropped == {"client": 0, "broker": 0}, f"the kernel dropped packets: {run.dropped}"
    comparison = compare(
        workdir / CLIENT_PCAP,
        workdir / BROKER_PCAP,
        client_ports=run.kipside_ports,
        broker_ports=[run.broker_port],
    )
    assert_broker_side(comparison.broker, run)
    assert_client_side(comparison.client, comparison.broker, run)
    assert_tshark_agrees(workdir / CLIENT_PCAP, comparison.client, run, "client")
    assert_tshark_agrees(workdir / BROKER_PCAP, comparison.broker, run, "broker")
    print(
        f"\n{run.scenario}: {comparison.client.requests} requests from clients, "
        f"{comparison.broker.requests} to the broker; savings {comparison.savings()}"
    )


def test_a_coalescing_run(tmp_path: Path) -> None:
    run = coalescing_run(tmp_path)
    check(run, tmp_path)


def test_a_transaction_run(tmp_path: Path) -> None:
    run = transaction_run(tmp_path)
    check(run, tmp_path)
    assert run.relay["concurrent_transactions"]["AddPartitionsToTxn"] > 0  # the window was met
