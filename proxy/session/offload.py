"""Work too costly for the event loop (columnar conversion), run in worker threads.

A stage's `Convert` and an answer's `convert` (core.decisions) turn record batches into
Parquet segments and back: milliseconds of CPU per batch, most of it in pyarrow and compiled
kernels that release the GIL. Run in the event loop they would stall every other client for as
long; here they run in trio's worker threads, at most `limit` at once (one per CPU by default),
while the loop goes on serving everyone else. The work itself is sans-I/O: it touches nothing
the loop uses, and what it counts it counts under its own lock (core.columnar).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

import trio

from kipside.protocol import ProtocolError
from kipside.proxy.core.answers import Pending

__all__ = ["Offload"]

T = TypeVar("T")

log = logging.getLogger("kipside.session")


class Offload:
    """The server's worker threads for costly work (one per CPU unless told)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limiter = trio.CapacityLimiter(limit or os.cpu_count() or 1)

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` in a worker thread; waits for a free one first."""
        return await trio.to_thread.run_sync(work, limiter=self.limiter)

    def converted(
        self,
        pending: Pending,
        convert: Callable[[bytes], Callable[[], bytes] | None],
        nursery: trio.Nursery,
    ) -> Pending:
        """The answer `pending` will be, once `convert` has had it: at once when it needs no
        work, else after that work ran in a worker thread (a task of `nursery`). An answer that
        fails, or that the work can't read, fails the result."""
        result = Pending()

        def answered() -> None:
            frame = pending.frame
            if frame is None:
                result.fail(pending.failure or "no response")
                return
            try:
                work = convert(frame)
            except ProtocolError as exc:
                result.fail(f"its answer could not be read ({exc})")
                return
            if work is None:
                result.resolve(frame)
            else:
                nursery.start_soon(self._finish, work, result)

        pending.on_done(answered)
        return result

    async def _finish(self, work: Callable[[], bytes], result: Pending) -> None:
        try:
            frame = await self.run(work)
        except ProtocolError as exc:
            result.fail(f"its answer could not be read ({exc})")
            return
        except Exception as exc:  # a bug: this answer fails, never the session
            log.exception("converting a broker's answer failed")
            result.fail(f"converting its answer failed ({exc!r})")
            return
        result.resolve(frame)
