"""Waiting in trio for an answer a core.answers.Pending carries (it has no loop of its own)."""

from __future__ import annotations

import trio

from kipside.proxy.core.answers import Pending

__all__ = ["answer_of"]


async def answer_of(pending: Pending) -> bytes:
    """The answer's frame once it comes, or UpstreamFailed."""
    if not pending.done:
        done = trio.Event()
        pending.on_done(done.set)
        await done.wait()
    else:
        await trio.lowlevel.checkpoint()
    return pending.result()
