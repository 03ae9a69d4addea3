"""Network loss between kipside and the broker: cut (resets, refused connections) and blackhole
(silence), then restored, during produce, transactions and consumer-group rebalances.

Each test runs real clients through kipside -> FaultRelay -> Tansu (fault_scenarios/, on
fault_kit/), fails the path mid-traffic, restores it, and then reads the topic from the broker
itself: every acknowledged message in the log exactly once, in order per producer and
partition; committed offsets where the clients left them.

Run: .venv/bin/pytest tests/integration/test_faults_network.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_scenarios import run_in_ci

pytestmark = pytest.mark.integration


def test_cut_then_blackhole_during_produce(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Idempotent confluent-kafka producers on shared lanes. First the path to the broker is
    reset and refused for 1 s: kipside fails the lanes, closes the clients that had batches on
    them, and redials. Then a silent partition: the lanes stay connected and hear nothing for
    2 s, until their answer timeout (the ProduceRequests' own timeout_ms, 3 s, being longer
    than --upstream-request-timeout 1) closes them with the clients that had a batch on them.
    Each time the clients resend once the path is back: nothing acknowledged is lost, nothing
    duplicated, nothing reordered."""
    run_in_ci("network-produce", tmp_path, request)


def test_cut_and_restore_during_transactions(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two confluent-kafka transactional producers, each transaction writing 10 messages and
    committing a consumer group's offset, with kipside pre-registering their outputs and
    group (a transactions rule); the path to the broker is reset and refused for 1 s. A
    transaction the fault broke is aborted and done again by the application: the committed
    log holds every committed transaction's messages exactly once, in order, nothing of an
    aborted one, and the group's committed offset is each producer's number of commits."""
    run_in_ci("network-transactions", tmp_path, request)


@pytest.mark.slow
def test_cut_during_a_consumer_group_rebalance(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One confluent-kafka group member is consuming (at least once: commit what it processed
    after every poll and on revoke); a second joins, and while the group rebalances (its
    JoinGroup seen by kipside) the path to the broker is reset and refused for 1 s. Afterwards
    every record was processed (some twice at most: the ones whose commit the fault lost), each
    member read its partitions in order, and the group's committed offsets are the ends."""
    run_in_ci("network-rebalance", tmp_path, request)
