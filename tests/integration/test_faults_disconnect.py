"""Clients that vanish mid-request, mid-coalesced-request and mid-hold, while a bystander (an
idempotent confluent-kafka producer) writes through the same kipside and the same lanes.

In one run, through kipside -> a FaultRelay that also simulates Apache Kafka's marker-writing
window after EndTxn (tests/txn_relay.py's MarkerWindowRelay, so kipside's transaction-begin
hold has something to hold) -> Tansu:

1. mid-request: raw sockets send half a ProduceRequest and reset or close;
2. gone before the answer: a raw socket sends a whole ProduceRequest and resets at once;
3. mid-coalesced-request: the relay holds the lanes' requests, so a raw client's batch queues
   on a lane behind the bystander's; the raw client resets, then the relay lets go;
4. mid-hold: a confluent-kafka transactional producer in a subprocess commits (the simulated
   window opens), begins the next transaction, and is SIGKILLed while kipside holds its
   AddPartitionsToTxn; then a successor with the same transactional.id must work.

Afterwards: the bystander lost nothing, wrote nothing twice, and kipside never closed its
connection; the relay read only whole, readable requests; what the vanished clients sent is
in the log at most once; the successor's transaction committed; and kipside's gauges are back
to zero once everyone has left (client connections, bytes in flight, paused connections).

Run: .venv/bin/pytest tests/integration/test_faults_disconnect.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_scenarios import run_in_ci

pytestmark = pytest.mark.integration


def test_clients_vanish_mid_request_mid_coalesced_request_and_mid_hold(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_in_ci("disconnects", tmp_path, request)
