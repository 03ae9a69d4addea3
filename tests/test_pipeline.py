"""The request pipeline in memory: core.decisions.Pipeline's rules (first decision wins, a
narrowed request goes on to the next stages, what no stage takes goes on the client's own
connection) and stages.pipeline's order and which stages are in force. No socket, no trio.
"""

from __future__ import annotations

from collections.abc import Callable

from test_session import heartbeat_request, request

from kipside.protocol import ApiKey, parse_request_header
from kipside.proxy.core.answers import Pending
from kipside.proxy.core.decisions import (
    DROP,
    FORWARD_OWN,
    Answer,
    ClientRequest,
    Close,
    Decision,
    Narrow,
    Pipeline,
    Take,
    Wait,
)
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.security.client_sasl import ClientSasl
from kipside.proxy.stages.pipeline import STAGE_ORDER, Stages
from kipside.proxy.stages.versions import VersionPolicy
from kipside.rules import RuleSet, parse_rules


class Handle:
    """A client connection as the stages see it."""

    def __init__(self) -> None:
        self.authenticated = False
        self.node_id: int | None = None
        self.client_id: str | None = "tests"
        self.principal: Principal = ANONYMOUS
        self.span: object = None
        self.sasl = ClientSasl()
        self.closed: list[str] = []

    def newest_own(self) -> Pending | None:
        return None

    def own_barrier(self) -> Pending:
        return Pending.answered(b"")

    def describe(self) -> str:
        return "client test"

    def disconnect(self, reason: str) -> None:
        self.closed.append(reason)

    def authenticated_as(self, principal: Principal) -> None:
        self.principal = principal


def client_request(frame: bytes, client: Handle | None = None) -> ClientRequest:
    return ClientRequest(parse_request_header(frame), frame, client or Handle())


def stage(result: Decision | None, seen: list[str], name: str) -> Callable[..., Decision | None]:
    def decide(request: ClientRequest) -> Decision | None:
        seen.append(name)
        return result

    return decide


def test_the_first_decision_wins_and_later_stages_are_not_asked() -> None:
    seen: list[str] = []
    answer = Answer(b"x")
    pipeline = Pipeline((stage(None, seen, "a"), stage(answer, seen, "b"), stage(DROP, seen, "c")))
    assert pipeline.decide(client_request(heartbeat_request(1)))[0] is answer
    assert seen == ["a", "b"]


def test_what_no_stage_takes_goes_on_the_own_connection() -> None:
    pipeline = Pipeline((stage(None, [], "a"),))
    assert pipeline.decide(client_request(heartbeat_request(1)))[0] is FORWARD_OWN


def test_a_narrowed_request_goes_on_to_the_next_stages() -> None:
    seen: list[str] = []
    narrowed = heartbeat_request(2)

    def merge(frame: bytes) -> bytes:
        return frame

    def last(request: ClientRequest) -> Decision:
        seen.append("last saw the narrowed frame" if request.frame == narrowed else "last")
        return FORWARD_OWN

    pipeline = Pipeline((stage(Narrow(narrowed, merge, close="why"), seen, "narrow"), last))
    decision, request = pipeline.decide(client_request(heartbeat_request(1)))
    assert decision is FORWARD_OWN
    assert request.frame == narrowed and request.merge is merge and request.close_after == "why"
    assert seen == ["narrow", "last saw the narrowed frame"]
    assert request.header.correlation_id == 1  # the header stays the client's


def test_narrowed_to_nothing_is_dropped_or_closed() -> None:
    for narrow, expected in (
        (Narrow(None), DROP),
        (Narrow(None, close="refused"), Close("refused")),
    ):
        pipeline = Pipeline((stage(narrow, [], "n"), stage(FORWARD_OWN, [], "own")))
        assert pipeline.decide(client_request(heartbeat_request(1)))[0] == expected


def stages(rules: RuleSet, shared: bool = False) -> Stages:
    if not shared:
        return Stages.build(lambda: rules, VersionPolicy(), None)
    built = Stages.build(lambda: rules, VersionPolicy(), None)
    return Stages(
        built.sasl,
        built.principals,
        built.versions,
        stage(None, [], "transactions"),
        stage(None, [], "coalescing"),
        stage(None, [], "short_apis"),
        built.own_connection,
    )


def test_stages_off_are_left_out_and_the_order_is_stage_order() -> None:
    assert STAGE_ORDER == (
        "sasl",
        "principals",
        "versions",
        "transactions",
        "coalescing",
        "short_apis",
        "own_connection",
    )
    plain = stages(RuleSet(), shared=True)
    kept = plain.pipeline(RuleSet()).stages
    assert kept == (
        plain.sasl,
        plain.versions,
        plain.coalescing,
        plain.short_apis,
        plain.own_connection,
    )
    ruled = parse_rules(
        "principals:\n  - {principal: 'User:a', topics: [x]}\n"
        "transactions:\n  - {transactional_id: t, outputs: [{topic: x}]}\n",
        "r.yaml",
    )
    everything = stages(ruled, shared=True)
    assert everything.pipeline(ruled).stages == tuple(
        getattr(everything, name) for name in STAGE_ORDER
    )
    one_to_one = stages(RuleSet())
    assert one_to_one.pipeline(RuleSet()).stages == (
        one_to_one.sasl,
        one_to_one.versions,
        one_to_one.own_connection,
    )


def test_a_request_passes_only_the_stages_that_take_its_api() -> None:
    ruled = parse_rules(
        "principals:\n  - {principal: 'User:a', topics: [x]}\n"
        "transactions:\n  - {transactional_id: t, outputs: [{topic: x}]}\n",
        "r.yaml",
    )
    built = Stages.build(lambda: ruled, VersionPolicy(), None)
    pipeline = built.pipeline(ruled)
    # Passthrough SASL: a ProduceRequest meets the principals rules and the own connection.
    assert pipeline.stages_for(ApiKey.PRODUCE) == (built.principals, built.own_connection)
    assert pipeline.stages_for(ApiKey.HEARTBEAT) == (built.own_connection,)
    assert pipeline.stages_for(ApiKey.SASL_HANDSHAKE) == (built.sasl, built.own_connection)
    assert pipeline.stages_for(ApiKey.API_VERSIONS) == (built.versions, built.own_connection)
    # Terminated SASL: every request meets the SASL stage first (none passes unauthenticated).
    terminating = Stages.build(lambda: ruled, VersionPolicy(), None, sasl_terminates=True)
    assert terminating.pipeline(ruled).stages_for(ApiKey.HEARTBEAT) == (
        terminating.sasl,
        terminating.own_connection,
    )


def test_one_to_one_forwards_everything_but_a_too_new_api_versions() -> None:
    pipeline = stages(RuleSet()).pipeline(RuleSet())
    assert pipeline.decide(client_request(heartbeat_request(1)))[0] is FORWARD_OWN
    too_new = request(ApiKey.API_VERSIONS, 99, 3)
    decision = pipeline.decide(client_request(too_new))[0]
    assert isinstance(decision, Answer)  # UNSUPPORTED_VERSION in the v0 layout


def test_sasl_passthrough_marks_the_client_for_its_own_connection() -> None:
    client = Handle()
    pipeline = stages(RuleSet(), shared=True).pipeline(RuleSet())
    handshake_v1 = request(ApiKey.SASL_HANDSHAKE, 1, 1, b"\x00\x05PLAIN")
    assert pipeline.decide(client_request(handshake_v1, client))[0] is FORWARD_OWN
    assert client.authenticated


def test_decisions_are_plain_values() -> None:
    pending = Pending()
    assert Take(pending, raw=True) == Take(pending, raw=True)
    assert Wait(pending, 1.0, "why").limit == 1.0
