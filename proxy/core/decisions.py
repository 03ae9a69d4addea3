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
| `DROP` | nothing is sent, nothing is owed |
| `Close` | close the connection (after the answers owed before this request) |
| `Wait` | wait for an earlier answer, then decide again from the first stage |

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
    "ClientHandle",
    "ClientRequest",
    "Close",
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

    def applied(self, request: ClientRequest) -> ClientRequest:
        assert self.frame is not None
        return replace(request, frame=self.frame, merge=self.merge, close_after=self.close)


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

    def decide(self, request: ClientRequest) -> tuple[Decision, ClientRequest]:
        """The decision about `request`, and the request it is about (narrowed, if a stage
        narrowed it)."""
        stages = self._by_key.get(request.header.api_key)
        if stages is None:
            stages = self.stages_for(request.header.api_key)
        for stage in stages:
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
