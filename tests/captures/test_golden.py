"""`kipside pcap` on small captures of kipside's own traffic, committed under golden/.

golden/{coalescing,transactions}/ hold a capture of each side of a real run through kipside
(client.pcap: clients <-> kipside; broker.pcap: kipside <-> a counting relay in front of Tansu),
what the relay and kipside counted during that run (run.json), and the outputs of
`kipside pcap summary --json` and `kipside pcap compare` (made by
`.venv/bin/python tests/captures/capture_run.py --golden`; see that script).

- The summaries and the comparison are the committed ones, to the byte.
- The broker side equals what the relay counted, independently of kipside and of the capture:
  requests per API, connections, Produce batches and records (coalescing); transactions,
  coordinator round trips and CONCURRENT_TRANSACTIONS answers (transactions).
- The client side equals kipside's own count of its clients' requests per API, and carries the
  very batches kipside forwarded (kipside never merges or re-encodes a batch).
- tshark's Kafka dissector agrees on the requests per API and on the partitions of the Produce
  requests it can read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captures.scenarios import Run
from captures.tshark_check import readable_partitions, tshark_view
from kipside.evidence import Summary, summarize
from kipside.proxy.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = ["coalescing", "transactions"]
SIDES = ["client", "broker"]


def _summary(scenario: str, side: str, monkeypatch: pytest.MonkeyPatch) -> Summary:
    monkeypatch.chdir(GOLDEN / scenario)  # the committed outputs name the files relatively
    return summarize(f"{side}.pcap")


def _requests(summary: Summary) -> dict[str, int]:
    return {name: api.requests for name, api in summary.apis.items()}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_summary_is_the_committed_one(
    scenario: str, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = json.loads((GOLDEN / scenario / f"summary-{side}.json").read_text())
    assert _summary(scenario, side, monkeypatch).as_dict() == expected


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_compare_prints_the_committed_comparison(
    scenario: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(GOLDEN / scenario)
    assert main(["pcap", "compare", "client.pcap", "broker.pcap"]) == 0
    assert capsys.readouterr().out == (GOLDEN / scenario / "compare.txt").read_text()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_broker_side_is_what_the_relay_counted(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.load(GOLDEN / scenario)
    summary = _summary(scenario, "broker", monkeypatch)
    assert_broker_side(summary, run)


def assert_broker_side(summary: Summary, run: Run) -> None:
    """The summary of a broker-side capture equals the relay's counts of the same run."""
    relay = run.relay
    assert _requests(summary) == relay["requests"]
    assert sum(summary.connections.values()) == relay["connections"]
    assert summary.skipped == dict.fromkeys(summary.skipped, 0)
    if run.scenario == "coalescing":
        assert summary.produce.batches == relay["produce_batches"]
        assert summary.produce.partitions == relay["produce_batches"]  # one batch a partition
        assert summary.produce.records == relay["produce_records"]
        assert summary.produce.acks0 == relay["acks0_requests"]
    else:
        assert relay["failed_end_txn"] == 0  # the relay counts no failed EndTxn in a transaction
        t = summary.transactions
        assert t.ended == relay["transactions_ended"]
        assert t.committed == relay["committed"]
        assert t.round_trips == relay["coordinator_round_trips"]
        assert (t.open, t.open_round_trips) == (0, 0)
        concurrent = {api: n for api, n in relay["concurrent_transactions"].items() if n}
        assert summary.concurrent_transactions == concurrent


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_client_side_is_what_kipside_counted_and_carries_the_same_batches(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.load(GOLDEN / scenario)
    client = _summary(scenario, "client", monkeypatch)
    broker = summarize("broker.pcap")
    assert_client_side(client, broker, run)


def assert_client_side(client: Summary, broker: Summary, run: Run) -> None:
    """The summary of a client-side capture equals kipside's count of its clients' requests,
    and its Produce batches are the broker side's."""
    assert _requests(client) == run.kipside["client_requests"]
    assert client.skipped == dict.fromkeys(client.skipped, 0)
    produce, upstream = client.produce, broker.produce
    assert (produce.batches, produce.records, produce.batch_bytes) == (
        upstream.batches,
        upstream.records,
        upstream.batch_bytes,
    )
    if run.scenario == "transactions":
        assert client.transactions.committed == run.kipside["committed_by_client"]
        assert client.concurrent_transactions == {}  # kipside held the client through them


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tshark_reads_the_same_requests_and_partitions(
    scenario: str, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = _summary(scenario, side, monkeypatch)
    assert_tshark_agrees(Path(f"{side}.pcap"), summary, Run.load(GOLDEN / scenario), side)


def assert_tshark_agrees(path: Path, summary: Summary, run: Run, side: str) -> None:
    ports = run.kipside_ports if side == "client" else [run.broker_port]
    view = tshark_view(path, ports)
    assert dict(view.requests) == _requests(summary)
    partitions = readable_partitions(summary.produce.partitions_by_version)
    assert view.readable_produce_partitions == partitions
    if run.scenario == "coalescing" and side == "client":
        assert partitions > summary.api("Produce").versions.get("v7", 0) > 0  # aiokafka's
