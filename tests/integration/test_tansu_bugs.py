"""The premise of the strict xfails in tansu_bugs.py: the broker itself (Tansu 0.6.0), asked
without kipside, still has each bug.

Run: .venv/bin/pytest -rxX tests/integration/test_tansu_bugs.py
"""

from __future__ import annotations

import pytest
from conftest import DirectProbe
from testkit.broker import TANSU_0_6_0

pytestmark = pytest.mark.integration

_ONLY_0_6_0 = pytest.mark.skipif(
    not TANSU_0_6_0, reason="the premise of the xfails in tansu_bugs.py, true of Tansu 0.6.0"
)


@_ONLY_0_6_0
@pytest.mark.parametrize(
    ("check", "what"),
    [
        ("aiokafka-idempotence", "an idempotent aiokafka producer starts (InitProducerId v0)"),
        ("read-committed-filters-aborted", "read_committed consumers skip aborted records"),
        ("kcat-metadata", "kcat -L reads the broker's ApiVersions v3"),
    ],
)
def test_tansu_itself_fails(check: str, what: str, direct_probe: DirectProbe) -> None:
    """The broker itself, asked without kipside, still fails what tests/integration/tansu_bugs.py
    marks as its bug: so those strict xfails blame the broker, not kipside."""
    ok, detail = direct_probe(check)
    assert not ok, f"Tansu now passes the check '{what}' ({detail}): drop its xfail mark"
