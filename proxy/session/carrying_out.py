"""What a decision of the pipeline asks of a session: the request sent on the client's own broker
connection or a lane, or an answer owed that kipside or a stage gives.
"""

from __future__ import annotations

from kipside.proxy.core.answers import Pending
from kipside.proxy.core.decisions import (
    Answer,
    ClientRequest,
    Close,
    Decision,
    ForwardLane,
    ForwardOwn,
    Take,
)
from kipside.proxy.session.own_connection import OwnConnection

__all__ = ["carry_out"]


async def carry_out(
    decision: Decision, request: ClientRequest, own: OwnConnection
) -> tuple[Pending | None, bool]:
    """Carry `decision` out: the answer it owes the client (None: none is owed), and whether
    that answer is a broker's raw one (still to be rewritten for the client). Raises
    UpstreamFailed when the broker can't be reached."""
    if type(decision) is Take:
        return decision.pending, decision.raw
    if type(decision) is ForwardOwn:
        if decision.raw:  # a legacy SASL token: its answer is the broker's next frame, as is
            return await own.send_raw(request.frame), False
        return await own.send(request), True
    if type(decision) is ForwardLane:
        header = request.header
        pending = decision.lane.send(request.frame, header.api_key, header.api_version)
        if pending is None:
            lane = decision.lane
            pending = await lane.dial_and_send(request.frame, header.api_key, header.api_version)
        return pending, True
    if type(decision) is Answer:
        return Pending.answered(decision.frame), False
    if type(decision) is Close and decision.answer is not None:
        return Pending.answered(decision.answer), False
    return None, False  # Drop, or a Close with nothing to answer
