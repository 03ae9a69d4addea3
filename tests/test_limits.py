"""The rule file's limits, enforced by kipside.proxy.core.limits: the reporter (one line per
limit per interval, every event counted), the protocol caps (tagged fields, partitions, frame
size) and that every limit is documented.

Socket-free where the behaviour lives in one object (the reporter, the protocol caps); a real
Session between loopback sockets (tests/test_session.py's wiring) where it is what a client
sees: closed on a hostile header or an oversized frame. Every test has an absolute
trio.fail_after (TIMEOUT) or runs no I/O.

The timeouts (idle, request read) are tests/test_limits_timeouts.py; in-flight bytes (a client
not read while it does not read its answers), tests/test_limits_in_flight.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import pytest
import trio
import trio.testing
from limits_kit import server_limits
from test_session import (
    API_VERSIONS_REQUEST_BODY,
    heartbeat_request,
    wired_session,
    without_correlation_id,
)

from kipside.protocol import (
    ApiKey,
    DecodeLimits,
    LimitExceeded,
    PartitionBatch,
    build_frame,
    encode_produce_request,
    encode_request_header,
    parse_produce_request,
    parse_request_header,
    request_body_offset,
)
from kipside.proxy.core.decisions import ClientHandle
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.core.limits import LimitReporter
from kipside.proxy.stages.principals import PrincipalRules
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import Limits, parse_rules

# ------------------------------------------------------------------------- the log and count


def test_a_flood_logs_one_line_per_limit_every_interval_and_counts_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside.limits")
    stats, now = Stats(), [100.0]
    reporter = LimitReporter(stats, interval=10.0, clock=lambda: now[0])
    for i in range(1000):
        reporter.reached("max_connections", f"refusing client {i}")
    reporter.reached("idle_timeout_ms", "idle client", level=logging.INFO)
    now[0] += 9.9
    reporter.reached("max_connections", "refusing client 1000")
    now[0] += 0.2
    reporter.reached("max_connections", "refusing client 1001")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "refusing client 0"),
        (logging.INFO, "idle client"),
        (
            logging.WARNING,
            "refusing client 1001 (1000 more of limits.max_connections in the last 10 s unlogged)",
        ),
    ]
    assert stats.limit_reached == {"max_connections": 1002, "idle_timeout_ms": 1}


# ------------------------------------------------------------------------- protocol caps

CAPS = DecodeLimits(max_tagged_fields=4, max_tagged_field_bytes=64, max_partitions=10)


def api_versions_with_header_tags(tags: list[bytes]) -> bytes:
    """An ApiVersions v3 request (header v2) whose header carries these tagged fields."""
    header = encode_request_header(ApiKey.API_VERSIONS, 3, 9, "tests")[:-1]  # no tag count
    section = bytes([len(tags)]) + b"".join(
        bytes([i, len(value)]) + value for i, value in enumerate(tags)
    )
    return build_frame(header + section, API_VERSIONS_REQUEST_BODY)


@pytest.mark.parametrize(
    ("tags", "limit"),
    [([b""] * 5, "max_tagged_fields"), ([b"x" * 65], "max_tagged_field_bytes"), ([b""] * 4, None)],
    ids=["five-tags", "65-byte-tag", "within"],
)
def test_request_header_tagged_fields_are_capped(tags: list[bytes], limit: str | None) -> None:
    frame = api_versions_with_header_tags(tags)
    if limit is None:
        assert parse_request_header(frame, CAPS).body_offset == request_body_offset(frame)
        return
    with pytest.raises(LimitExceeded) as caught:
        parse_request_header(frame, CAPS)
    assert caught.value.limit == limit
    assert parse_request_header(frame).api_key == ApiKey.API_VERSIONS  # no caps: read as ever


def produce_frame(version: int, topics: int, partitions: int) -> bytes:
    batches = [
        PartitionBatch(f"t{t}", p, memoryview(b""))
        for t in range(topics)
        for p in range(partitions)
    ]
    header = encode_request_header(ApiKey.PRODUCE, version, 1, "tests")
    body = encode_produce_request(version, acks=1, timeout_ms=1000, partitions=batches)
    return build_frame(header, b"".join(bytes(chunk) for chunk in body))


@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize(
    ("topics", "partitions", "refused"),
    [(1, 10, None), (1, 11, "partitions"), (11, 1, "topics"), (6, 2, "partitions")],
)
def test_produce_topics_and_partitions_are_capped(
    version: int, topics: int, partitions: int, refused: str | None
) -> None:
    frame = produce_frame(version, topics, partitions)
    offset = parse_request_header(frame).body_offset
    if refused is None:
        assert len(parse_produce_request(frame, offset, version, CAPS).partitions) == 10
        return
    with pytest.raises(LimitExceeded, match=refused) as caught:
        parse_produce_request(frame, offset, version, CAPS)
    assert caught.value.limit == "max_partitions"


def test_a_principal_check_does_not_let_a_request_over_a_cap_through() -> None:
    # A request kipside cannot read is let through for the broker to answer; one over a cap
    # must not be, or 11 partitions would slip past a principal's topic restriction.
    rules = parse_rules(
        'limits: {max_partitions_per_request: 10}\nprincipals: [{principal: "*", topics: [t0]}]',
        "p.yaml",
    )
    check = PrincipalRules(lambda: rules)
    client = cast(ClientHandle, _Client())
    within, over = produce_frame(9, 1, 10), produce_frame(9, 1, 11)
    assert check.refusal(client, within, parse_request_header(within)) is None
    with pytest.raises(LimitExceeded):
        check.refusal(client, over, parse_request_header(over))


@dataclass(eq=False)  # hashable, as a session is
class _Client:
    principal: Principal = ANONYMOUS

    def describe(self) -> str:
        return "client 127.0.0.1:1"


# ------------------------------------------------------------------------- a real session


@pytest.mark.parametrize(
    ("tags", "key"),
    [([b""] * 65, "max_tagged_fields"), ([b"x" * 100], "max_tagged_field_bytes")],
    ids=["65-tags", "100-byte-tag"],
)
async def test_a_request_header_over_a_tagged_field_cap_closes_the_client(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    tags: list[bytes],
    key: str,
) -> None:
    limits = server_limits(max_tagged_field_bytes=64)
    async with wired_session(limits) as w:
        within = api_versions_with_header_tags([b"ok"] * 3)
        forwarded = await w.forwarded(within)  # under the caps: forwarded unchanged
        assert without_correlation_id(forwarded) == without_correlation_id(within)
        await w.send(api_versions_with_header_tags(tags))
        assert await w.client_closed()
    assert limits.stats.limit_reached == {key: 1}
    assert "sent an ApiVersions request over" in caplog.text
    assert f"over limits.{key}" in caplog.text


async def test_an_oversized_request_frame_is_a_limit(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = server_limits()
    async with wired_session(limits) as w:  # its frame cap is 1 MiB
        await w.send((2 << 20).to_bytes(4, "big") + bytes(64))
        assert await w.client_closed()
        assert await w.nothing_forwarded()
    assert limits.stats.limit_reached == {"max_frame_bytes": 1}
    assert "frame size 2097152, over limits.max_frame_bytes" in caplog.text


async def test_a_broker_answer_over_the_frame_cap_closes_that_connection_and_says_so(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = server_limits()
    async with wired_session(limits) as w:  # its frame cap is 1 MiB
        forwarded = await w.forwarded(heartbeat_request(3))
        oversized = (2 << 20).to_bytes(4, "big") + forwarded[8:12]  # size, correlation id
        await w.answer(oversized)
        assert await w.client_closed()  # its broker connection is gone: the client retries
    assert limits.stats.limit_reached == {"max_frame_bytes": 1}
    assert (
        "the broker sent a response to Heartbeat v0 of 2097152 bytes, over "
        "limits.max_frame_bytes (1048576)" in caplog.text
    )


def test_every_limit_key_has_a_line_in_the_docs() -> None:
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    rules_md, reliability_md = (
        (docs / "rules.md").read_text(),
        (docs / "reliability.md").read_text(),
    )
    for key in (f.name for f in Limits.__dataclass_fields__.values() if f.init):
        assert f"`{key}`" in rules_md, key
        assert f"`limits.{key}`" in reliability_md, key
