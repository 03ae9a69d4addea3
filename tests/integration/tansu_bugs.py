"""Strict xfail marks for the known bugs of the test broker, Tansu 0.6.0 (seen without kipside:
tests/integration/test_tansu_bugs.py asks Tansu directly). kipside does not work around broker bugs,
so a test whose outcome depends on one is expected to fail, but only on that broker version and only
the way the bug fails: strict, so the test reports the moment Tansu or kipside changes, and
`raises=`, so a kipside regression on the same path fails instead of hiding as an expected failure.

Each bug has a direct-probe test (tests/integration/test_tansu_bugs.py, test_tansu_itself_*)
that asks the broker itself, without kipside, and asserts it still fails: the premise of the xfail.
"""

from __future__ import annotations

import pytest
from aiokafka.errors import UnknownError
from testkit.broker import TANSU_0_6_0, tansu_version

_ON = f"Tansu {tansu_version()}"

AIOKAFKA_INIT_PRODUCER_ID_V0 = pytest.mark.xfail(
    TANSU_0_6_0,
    strict=True,
    raises=UnknownError,
    reason=f"{_ON} answers aiokafka's InitProducerId v0 (the only version aiokafka sends) with "
    "UNKNOWN_SERVER_ERROR, so no idempotent or transactional aiokafka producer starts",
)

NO_ABORTED_TRANSACTIONS = pytest.mark.xfail(
    TANSU_0_6_0,
    strict=True,
    raises=AssertionError,
    reason=f"{_ON} sends no AbortedTransactions in Fetch responses, so read_committed consumers "
    "return aborted records (librdkafka: 'received abort txn ctrl msg ... but there are no "
    "known aborted transactions: ignoring')",
)


def kcat_api_versions_v3(direct: bool) -> pytest.MarkDecorator:
    """Only when clients dial the broker itself (KIPSIDE_TEST_DIRECT=1): through kipside, kcat
    gets kipside's ApiVersions answer and works."""
    return pytest.mark.xfail(
        TANSU_0_6_0 and direct,
        strict=True,
        raises=AssertionError,
        reason=f"kcat 1.7.1 (librdkafka 2.0.2) cannot parse {_ON}'s ApiVersions v3 response "
        "(Read underflow in its tagged fields: Tansu sends SupportedFeatures, "
        "FinalizedFeaturesEpoch, FinalizedFeatures and ZkMigrationReady even at their defaults, "
        "which Apache Kafka omits)",
    )
