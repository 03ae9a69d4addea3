"""What the limits' tests (tests/test_limits*.py) share: ServerLimits with chosen limits, as
a real Session is given them."""

from __future__ import annotations

from kipside.proxy.core.limits import ServerLimits
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import Limits


def server_limits(**limits: int) -> ServerLimits:
    chosen = Limits(**limits)
    return ServerLimits(lambda: chosen, Stats())
