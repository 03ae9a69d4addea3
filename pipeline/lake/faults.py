"""The lake's one fault-injection point, for the crash tests (tests/pipelines/test_lake_kill.py).

With KIPSIDE_LAKE_CRASH_BEFORE_COMMIT=<id> in the driver's environment, the driver kills itself
with SIGKILL at the most dangerous moment of micro-batch <id>'s commit, where a crash must
still leave every record once after the restart:
- Iceberg: the data files are written, neither table's snapshot is committed;
- plain Parquet: the manifest is written and the first file renamed into place (readers see
  part of the micro-batch), the other files and the commit marker are not.

Unset, which it always is outside the tests, it does nothing. It must never do anything else.
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["CRASH_BEFORE_COMMIT", "crash_point"]

CRASH_BEFORE_COMMIT: Final = "KIPSIDE_LAKE_CRASH_BEFORE_COMMIT"


def crash_point(batch_id: int) -> None:
    """SIGKILL of this process if the crash tests asked for it at this micro-batch."""
    if os.environ.get(CRASH_BEFORE_COMMIT) == str(batch_id):
        os.kill(os.getpid(), signal.SIGKILL)
