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

from captures.checks import assert_broker_side, assert_client_side, assert_tshark_agrees
from captures.scenarios import Run
from kipside.evidence import Summary, summarize
from kipside.proxy.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = ["coalescing", "transactions"]
SIDES = ["client", "broker"]


def _summary(scenario: str, side: str, monkeypatch: pytest.MonkeyPatch) -> Summary:
    monkeypatch.chdir(GOLDEN / scenario)  # the committed outputs name the files relatively
    return summarize(f"{side}.pcap")


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


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_client_side_is_what_kipside_counted_and_carries_the_same_batches(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.load(GOLDEN / scenario)
    client = _summary(scenario, "client", monkeypatch)
    broker = summarize("broker.pcap")
    assert_client_side(client, broker, run)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tshark_reads_the_same_requests_and_partitions(
    scenario: str, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = _summary(scenario, side, monkeypatch)
    assert_tshark_agrees(Path(f"{side}.pcap"), summary, Run.load(GOLDEN / scenario), side)
