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
from kipside.evidence import summarize
from kipside.proxy.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = ["coalescing", "transactions"]
SIDES = ["client", "broker"]


@pytest.fixture(params=SCENARIOS)
def golden(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scenario's committed directory, made the working directory: the committed outputs
    name the captures relatively."""
    directory = GOLDEN / str(request.param)
    monkeypatch.chdir(directory)
    return directory


@pytest.mark.parametrize("side", SIDES)
def test_summary_is_the_committed_one(golden: Path, side: str) -> None:
    expected = json.loads((golden / f"summary-{side}.json").read_text())
    assert summarize(f"{side}.pcap").as_dict() == expected


def test_compare_prints_the_committed_comparison(
    golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pcap", "compare", "client.pcap", "broker.pcap"]) == 0
    assert capsys.readouterr().out == (golden / "compare.txt").read_text()


def test_broker_side_is_what_the_relay_counted(golden: Path) -> None:
    assert_broker_side(summarize("broker.pcap"), Run.load(golden))


def test_client_side_is_what_kipside_counted_and_carries_the_same_batches(golden: Path) -> None:
    client, broker = summarize("client.pcap"), summarize("broker.pcap")
    assert_client_side(client, broker, Run.load(golden))


@pytest.mark.parametrize("side", SIDES)
def test_tshark_reads_the_same_requests_and_partitions(golden: Path, side: str) -> None:
    summary = summarize(f"{side}.pcap")
    assert_tshark_agrees(Path(f"{side}.pcap"), summary, Run.load(golden), side)
