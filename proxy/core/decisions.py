"""The request pipeline's vocabulary: a client's request, and what a stage decides about it.

Every request a client sends passes the stages of the pipeline in one order (stages.pipeline
lists them). Each stage looks at the request and returns a `Decision`, or None to leave it to
the next stage; the first decision wins, and the client's own broker connection takes what no
stage took. The driver of the client connection (session.session) carries a decision out:

| decision | what the driver does |
|---|---|
| `FORWARD_OWN` | send the request on the client's own broker connection (dialled on first use) |
| `ForwardLane` | send it on a shared lane (correlation ids remapped) |
| `Answer` | owe the client kipside's own answer |
| `Take` | owe the client an answer that comes later (a coalesced produce, a transaction call) |
| `Narrow` | go on with part of the request (the stages after this one decide about it) |
| `Convert` | run the stage's costly work off the event loop, then go on with what it decided |
| `DROP` | nothing is sent, nothing is owed |
| `Close` | close the connection (after the answers owed before this request) |
| `Wait` | wait for an earlier answer, then decide again from the first stage |

A stage may also change the broker's answer before the client gets it: `merge` (cheap, when
the answer is written) and `convert` (costly: the driver runs it off the event loop first).

Plain objects: nothing here does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final, Protocol

from kipside.protocol import RequestHeader
from kipside.proxy.core.answers import Pending
from kipside.proxy.core.identity import Principal

__all__ = [
    "DROP",
    "FORWARD_OWN",
    "FORWARD_OWN_RAW",
    "Answer",
    "AnswerConvert",
    "ClientHandle",
    "ClientRequest",
    "Close",
    "Convert",
    "Decision",
    "Drop",
    "ForwardLane",
    "ForwardOwn",
    "Lane",
    "Narrow",
    "Pipeline",
    "Stage",
    "Take",
    "Wait",
    "chain",
]


class ClientHandle(Protocol):
    """A client connection as the stages see it (the session's driver is one). Stages key
    what they remember per client by the handle itself."""

    authenticated: bool
    """Set once the client's own SASL passes through kipside: from then on every request goes
    on its own connection (a SASL identity belongs to one connection)."""

    @property
    def node_id(self) -> int | None:
        """The broker node whose listener the client dialled (None: the bootstrap listener)."""

    @property
    def client_id(self) -> str | None: ...

    @property
    def principal(self) -> Principal:
        """Who the client is to kipside: it shares connections only with its own principal."""

    @property
    def span(self) -> object:
        """The span of the request being decided (for a stage to link or annotate)."""

    def newest_own(self) -> Pending | None:
        """The answer to the newest request in flight on the client's own connection."""

    def own_barrier(self) -> Pending:
        """A request of kipside's own sent on the client's own connection now, behind what
        it carries: its answer comes once the broker has handled all of that (acks=0
        requests included)."""

    def describe(self) -> str: ...

    def disconnect(self, reason: str) -> None:
        """Close the client connection now, as a broker would on a lost connection."""

    def authenticated_as(self, principal: Principal) -> None:
        """The client proved it is `principal` (kipside terminates its SASL)."""

    def __hash__(self) -> int: ...


AnswerConvert = Callable[[bytes], Callable[[], bytes] | None]
"""What a stage does to the broker's answer at a cost in CPU: given the answer, the work that
turns it into the client's (for the driver to run off the event loop), or None when this answer
needs none."""


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """One request of one client, as the stages see it."""

    header: RequestHeader
    frame: bytes
    client: ClientHandle
    received_at: float = 0.0
    """When the request was read, on the driver's clock."""
    merge: Callable[[bytes], bytes] | None = None
    """Set once a stage narrowed the request: turns the broker's answer to what is left into
    the answer the client is owed."""
    close_after: str | None = None
    """Set when a stage narrowed the request and the connection must close once it is sent."""
    convert: AnswerConvert | None = None
    """Set once a stage must change the broker's answer at a cost (run before `merge`)."""

    @property
    def api_key(self) -> int:
        return self.header.api_key


class Decision:
    """What a stage decided about a request (one of the classes below)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ForwardOwn(Decision):
    raw: bool = False
    """A legacy SASL token: sent as it is, its answer the broker's next frame."""


FORWARD_OWN: Final = ForwardOwn()
FORWARD_OWN_RAW: Final = ForwardOwn(raw=True)


class Lane(Protocol):
    """A shared broker connection a stage chose (upstream.lanes.LanePool's lane)."""

    def send(self, frame: bytes, api_key: int, api_version: int) -> Pending | None:
        """Send now if the lane's connection is open; None if it must be dialled first."""

    async def dial_and_send(self, frame: bytes, api_key: int, api_version: int) -> Pending:
        """Dial the lane's connection if needed, then send."""


@dataclass(frozen=True, slots=True)
class ForwardLane(Decision):
    lane: Lane


@dataclass(frozen=True, slots=True)
class Answer(Decision):
    frame: bytes
    """kipside's answer, as the client must see it."""


@dataclass(frozen=True, slots=True)
class Take(Decision):
    pending: Pending | None
    """The answer to come; None: the client expects none (acks=0)."""
    raw: bool
    """The answer will be the broker's frame, which still needs kipside's rewrites."""


@dataclass(frozen=True, slots=True)
class Narrow(Decision):
    """The stage lets part of the request go on: `frame` (None: nothing of it)."""

    frame: bytes | None
    merge: Callable[[bytes], bytes] | None = None
    close: str | None = None
    """Close the connection once `frame` (if any) is sent, saying why."""
    convert: AnswerConvert | None = None

    def applied(self, request: ClientRequest) -> ClientRequest:
        """The request narrowed: this frame; the answer to it goes through this stage's
        conversion and merge first, then through those of the stages before (theirs were made
        for the request they saw)."""
        assert self.frame is not None
        merge, convert = self.merge, self.convert
        if request.merge is not None:
            merge = request.merge if merge is None else chain(merge, request.merge)
        if request.convert is not None:
            # The conversion runs before every merge, so only the last stage to change an
            # answer may convert it (the columnar stage, after principals).
            assert convert is None, "two stages convert the same answer"
            convert = request.convert
        close = self.close if self.close is not None else request.close_after
        return replace(request, frame=self.frame, merge=merge, close_after=close, convert=convert)


def chain(
    first: Callable[[bytes], bytes], second: Callable[[bytes], bytes]
) -> Callable[[bytes], bytes]:
    """One merge of two: `first`, then `second` on what it gave."""

    def both(answer: bytes) -> bytes:
        return second(first(answer))

    return both


@dataclass(frozen=True, slots=True)
class Drop(Decision):
    """Nothing is sent and nothing is owed."""


DROP: Final = Drop()


@dataclass(frozen=True, slots=True)
class Close(Decision):
    """Close the connection once the answers owed before this request (and `answer`, kipside's
    answer to this one, if given) are written."""

    reason: str
    level: int = logging.INFO
    answer: bytes | None = None


@dataclass(frozen=True, slots=True)
class Wait(Decision):
    """Wait for `pending` (at most `limit` seconds), then decide again from the first stage.
    Past the limit, close the connection with `too_long` as the reason."""

    pending: Pending
    limit: float
    too_long: str


Stage = Callable[[ClientRequest], Decision | None]
"""A stage: a decision about the request, or None to leave it to the next stage. A stage with
an `api_keys` attribute (a set of API keys) is asked only about requests of those APIs; one
without is asked about every request."""


@dataclass(frozen=True, slots=True)
class Convert(Decision):
    """The stage must work at a cost in CPU before it can decide (columnar encoding): the driver
    runs `work` off its event loop, then hands what it decided to `Pipeline.resume`: None to
    leave the request as it is, a `Narrow` to go on with, or any other decision."""

    work: Callable[[], Decision | None]
    stage: Stage
    """The stage that asked: the pipeline goes on from the one after it."""


class Pipeline:
    """Stages in order: the first decision wins, a `Narrow` goes on with what is left to the
    stages after it, and what no stage takes goes on the client's own connection. Each request
    passes only the stages that take its API (their `api_keys`), so a stage costs nothing to
    the requests of other APIs."""

    __slots__ = ("_by_key", "stages")

    def __init__(self, stages: tuple[Stage, ...]) -> None:
        self.stages = stages
        self._by_key: dict[int, tuple[Stage, ...]] = {}

    def stages_for(self, api_key: int) -> tuple[Stage, ...]:
        """The stages a request of `api_key` passes, in order."""
        found = self._by_key.get(api_key)
        if found is None:
            found = self._by_key[api_key] = tuple(
                stage
                for stage in self.stages
                if (keys := getattr(stage, "api_keys", None)) is None or api_key in keys
            )
        return found

    def decide(self, request: ClientRequest, start: int = 0) -> tuple[Decision, ClientRequest]:
        """The decision about `request`, and the request it is about (narrowed, if a stage
        narrowed it); from the stage at `start` on of those that take its API."""
        stages = self._by_key.get(request.header.api_key)
        if stages is None:
            stages = self.stages_for(request.header.api_key)
        for stage in stages[start:] if start else stages:
            decision = stage(request)
            if decision is None:
                continue
            if type(decision) is Narrow:
                if decision.frame is None:
                    return (DROP if decision.close is None else Close(decision.close)), request
                request = decision.applied(request)
                continue
            return decision, request
        return FORWARD_OWN, request

    def resume(
        self, convert: Convert, decided: Decision | None, request: ClientRequest
    ) -> tuple[Decision, ClientRequest]:
        """Go on after a `Convert`: with what its work `decided`, from the stage after the one
        that asked."""
        if decided is None:
            pass
        elif type(decided) is Narrow:
            if decided.frame is None:
                return (DROP if decided.close is None else Close(decided.close)), request
            request = decided.applied(request)
        else:
            return decided, request
        stages = self.stages_for(request.header.api_key)
        return self.decide(request, stages.index(convert.stage) + 1)
