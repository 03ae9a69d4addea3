"""Tests for the rule-file model (rules/): generated valid rule files parse to the model they
describe and round-trip through describe(); schema-shaped junk gives rules or a RuleError,
never a crash."""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from rules_kit import DEFAULT_API_KEYS, content

from kipside.rules import (
    CoalescingRule,
    CoalescingRules,
    HoldBegin,
    Limits,
    RuleError,
    RuleSet,
    Tracing,
    TransactionOutput,
    TransactionRule,
    parse_rules,
)

# PyYAML's emitter writes NEL/LS/PS raw inside quoted scalars with allow_unicode=True and its
# scanner then folds them ('\x85' comes back as ' '), so yaml.safe_load itself would not
# round-trip them. Lone surrogates cannot be encoded at all.
_TEXT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x85\u2028\u2029"),
    min_size=1,
    max_size=12,
)
_TOPIC = st.from_regex(r"[a-zA-Z0-9._-]{1,20}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)


_LIMITS = st.fixed_dictionaries(
    {},
    optional={
        "max_frame_bytes": st.integers(1024, 2**31 - 1),
        "max_connections": st.integers(1, 10**12),
    },
)


def _coalescing(frame: int) -> st.SearchStrategy[dict[str, Any]]:
    """A coalescing section whose max_request_bytes, if set, fits in a ``frame``-byte frame."""
    rule = st.fixed_dictionaries(
        {"coalesce": st.booleans()}, optional={"topic": _TEXT, "client_id": _TEXT}
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "enabled": st.booleans(),
            "lanes": st.integers(1, 64),
            "linger_ms": st.integers(0, 10**6)
            | st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
            "max_request_bytes": st.integers(1024, frame),
            "rules": st.lists(rule, max_size=4),
        },
    )


_OUTPUT = st.fixed_dictionaries(
    {"topic": _TOPIC},
    optional={
        "partitions": st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=5, unique=True)
    },
)
_TRANSACTION_REQUIRED: dict[str, st.SearchStrategy[Any]] = {
    "transactional_id": _TEXT,
    "outputs": st.lists(_OUTPUT, max_size=3, unique_by=lambda o: str(o["topic"])),
}
_TRANSACTION_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "consumer_group": _TEXT,
    "hold_begin": st.fixed_dictionaries({}, optional={"max_ms": st.integers(1, 300_000)}),
}
_TRANSACTION = st.fixed_dictionaries(_TRANSACTION_REQUIRED, optional=_TRANSACTION_OPTIONAL)
_TRACING = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.booleans(),
        "api_keys": st.lists(st.integers(0, 32767) | _TEXT, max_size=6),
    },
)


@st.composite
def _rule_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid rule file as plain data, with a random subset of its optional keys."""
    data: dict[str, Any] = {}
    frame = 104_857_600
    if draw(st.booleans()):
        data["limits"] = draw(_LIMITS)
        frame = data["limits"].get("max_frame_bytes", frame)
    if draw(st.booleans()):
        data["coalescing"] = draw(_coalescing(frame))
    if frame < 1_048_576:
        # The default max_request_bytes would not fit in the frame; say how much fits.
        data.setdefault("coalescing", {}).setdefault(
            "max_request_bytes", draw(st.integers(1024, frame))
        )
    if draw(st.booleans()):
        data["transactions"] = draw(st.lists(_TRANSACTION, max_size=3))
    if draw(st.booleans()):
        data["tracing"] = draw(_TRACING)
    return data


def _expected(data: dict[str, Any]) -> RuleSet:
    """The model ``data`` should parse to, with the documented defaults spelled out here."""
    limits = data.get("limits", {})
    coalescing = data.get("coalescing", {})
    tracing = data.get("tracing", {})
    return RuleSet(
        limits=Limits(
            max_frame_bytes=limits.get("max_frame_bytes", 104_857_600),
            max_connections=limits.get("max_connections", 10_000),
        ),
        coalescing=CoalescingRules(
            enabled=coalescing.get("enabled", True),
            lanes=coalescing.get("lanes", 2),
            linger_ms=coalescing.get("linger_ms", 0),
            max_request_bytes=coalescing.get("max_request_bytes", 1_048_576),
            rules=tuple(
                CoalescingRule(
                    topic=r.get("topic", "*"),
                    client_id=r.get("client_id", "*"),
                    coalesce=r["coalesce"],
                )
                for r in coalescing.get("rules", [])
            ),
        ),
        transactions=tuple(
            TransactionRule(
                transactional_id=t["transactional_id"],
                outputs=tuple(
                    TransactionOutput(
                        topic=o["topic"],
                        partitions=tuple(o["partitions"]) if "partitions" in o else None,
                    )
                    for o in t["outputs"]
                ),
                consumer_group=t.get("consumer_group"),
                hold_begin=HoldBegin(max_ms=t.get("hold_begin", {}).get("max_ms", 5000)),
            )
            for t in data.get("transactions", [])
        ),
        tracing=Tracing(
            enabled=tracing.get("enabled", True),
            api_keys=tuple(tracing.get("api_keys", DEFAULT_API_KEYS)),
        ),
    )


@settings(deadline=None)
@given(
    data=_rule_dicts(),
    flow=st.sampled_from([None, True, False]),
    unicode=st.booleans(),
    sort_keys=st.booleans(),
)
def test_generated_rule_files_round_trip(
    data: dict[str, Any], flow: bool | None, unicode: bool, sort_keys: bool
) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=unicode, sort_keys=sort_keys)
    rules = parse_rules(text, "gen.yaml")
    assert yaml.safe_load(text) == data
    assert content(rules) == content(_expected(data))
    assert rules.version == hashlib.sha256(text.encode()).hexdigest()[:12]
    # describe() gives back the same data with every default filled in.
    body = {k: v for k, v in rules.describe().items() if k not in ("source", "version")}
    assert content(parse_rules(yaml.safe_dump(body), "described.yaml")) == content(rules)


_SCHEMA_WORDS = [
    "limits",
    "coalescing",
    "transactions",
    "tracing",
    "max_frame_bytes",
    "max_connections",
    "enabled",
    "lanes",
    "linger_ms",
    "max_request_bytes",
    "rules",
    "topic",
    "client_id",
    "coalesce",
    "transactional_id",
    "outputs",
    "partitions",
    "consumer_group",
    "hold_begin",
    "max_ms",
    "api_keys",
]
_ANY_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-10, 2**40)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(_SCHEMA_WORDS)
)
_ANY_TREE = st.recursive(
    _ANY_SCALAR,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_SCHEMA_WORDS) | st.integers(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(deadline=None)
@given(_ANY_TREE)
def test_any_document_gives_rules_or_rule_error(data: object) -> None:
    """Schema-shaped junk never crashes the checker: it is a RuleSet or a RuleError."""
    try:
        parse_rules(yaml.safe_dump(data), "junk.yaml")
    except RuleError as error:
        for problem in error.problems:
            assert problem.file == "junk.yaml"
            assert problem.line >= 1
            assert problem.key and problem.message
