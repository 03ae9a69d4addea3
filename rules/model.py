"""The in-memory model of a kipside rule file: frozen, slotted dataclasses and pure lookups.

Everything here is plain, immutable data plus pure functions over it (glob matching,
rule lookup, :meth:`RuleSet.describe`). The model does no validation of its own:
:func:`rules.parse_rules` is the validating constructor, and the bounds it enforces are
the constants below, so the loader, the docs and the tests share one source of truth.

This module must never do I/O and never import trio, ``proxy`` or ``protocol``; the proxy
reads a ``RuleSet`` but the ``RuleSet`` knows nothing about the proxy.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_SOURCE",
    "DEFAULT_TRACED_API_KEYS",
    "DEFAULT_VERSION",
    "CoalescingRule",
    "CoalescingRules",
    "HoldBegin",
    "Limits",
    "RuleSet",
    "Tracing",
    "TransactionOutput",
    "TransactionRule",
    "rules_version",
]

INT32_MAX = 2_147_483_647

MAX_FRAME_BYTES_DEFAULT = 100 * 1024 * 1024
MAX_FRAME_BYTES_MIN = 1024
MAX_FRAME_BYTES_MAX = INT32_MAX  # Kafka frame sizes are signed 32-bit.
MAX_CONNECTIONS_DEFAULT = 10_000
MAX_CONNECTIONS_MIN = 1

COALESCING_ENABLED_DEFAULT = True
LANES_DEFAULT = 2
LANES_MIN = 1
LANES_MAX = 64
LINGER_MS_DEFAULT = 0.0
MAX_REQUEST_BYTES_DEFAULT = 1024 * 1024
MAX_REQUEST_BYTES_MIN = 1024

HOLD_BEGIN_MAX_MS_DEFAULT = 5_000
HOLD_BEGIN_MAX_MS_MIN = 1
HOLD_BEGIN_MAX_MS_MAX = 300_000
PARTITION_MAX = INT32_MAX  # Partition ids are int32 on the wire.

TRACING_ENABLED_DEFAULT = False
API_KEY_MIN = 0
API_KEY_MAX = 32_767  # API keys are int16 on the wire.
DEFAULT_TRACED_API_KEYS: tuple[int | str, ...] = (
    "Produce",
    "Fetch",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "TxnOffsetCommit",
    "InitProducerId",
)

DEFAULT_SOURCE = "<defaults>"


def rules_version(data: bytes) -> str:
    """The version tag of a rule file: the first 12 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()[:12]


# The built-in defaults are exactly what an empty rule file means, so they share its version.
DEFAULT_VERSION = rules_version(b"")


def _compile_glob(pattern: str) -> re.Pattern[str]:
    # fnmatchcase semantics (case-sensitive on every platform: Kafka names are
    # case-sensitive), compiled once per rule because matching runs per request.
    return re.compile(fnmatch.translate(pattern))


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource limits for the proxy as a whole."""

    max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT
    max_connections: int = MAX_CONNECTIONS_DEFAULT

    def describe(self) -> dict[str, Any]:
        return {"max_frame_bytes": self.max_frame_bytes, "max_connections": self.max_connections}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescingRule:
    """One ``coalescing.rules`` entry: whether produce traffic matching both globs coalesces."""

    topic: str = "*"
    client_id: str = "*"
    coalesce: bool
    _topic_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _client_id_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen dataclasses forbid normal assignment; these are derived caches only.
        object.__setattr__(self, "_topic_re", _compile_glob(self.topic))
        object.__setattr__(self, "_client_id_re", _compile_glob(self.client_id))

    def matches(self, topic: str, client_id: str) -> bool:
        return (
            self._topic_re.match(topic) is not None
            and self._client_id_re.match(client_id) is not None
        )

    def describe(self) -> dict[str, Any]:
        return {"topic": self.topic, "client_id": self.client_id, "coalesce": self.coalesce}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescingRules:
    """The ``coalescing`` section: how produce requests are merged into multi-batch requests."""

    enabled: bool = COALESCING_ENABLED_DEFAULT
    lanes: int = LANES_DEFAULT
    linger_ms: float = LINGER_MS_DEFAULT
    max_request_bytes: int = MAX_REQUEST_BYTES_DEFAULT
    rules: tuple[CoalescingRule, ...] = ()

    def applies(self, topic: str, client_id: str) -> bool:
        """Whether produce traffic for ``topic`` from ``client_id`` may be coalesced.

        The first rule whose ``topic`` and ``client_id`` globs both match decides; when no
        rule matches, ``enabled`` decides. A client without a client id is passed as "".
        """
        for rule in self.rules:
            if rule.matches(topic, client_id):
                return rule.coalesce
        return self.enabled

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "lanes": self.lanes,
            "linger_ms": self.linger_ms,
            "max_request_bytes": self.max_request_bytes,
            "rules": [rule.describe() for rule in self.rules],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionOutput:
    """A topic a transaction writes to; ``partitions`` is None for "every partition"."""

    topic: str
    partitions: tuple[int, ...] | None = None

    def describe(self) -> dict[str, Any]:
        # Absent rather than null, so describe() output is itself a valid rule file.
        out: dict[str, Any] = {"topic": self.topic}
        if self.partitions is not None:
            out["partitions"] = list(self.partitions)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldBegin:
    """How long the proxy may hold a transaction's first request while it pre-registers."""

    max_ms: int = HOLD_BEGIN_MAX_MS_DEFAULT

    def describe(self) -> dict[str, Any]:
        return {"max_ms": self.max_ms}


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionRule:
    """One ``transactions`` entry: what producers whose transactional id matches will touch."""

    transactional_id: str
    outputs: tuple[TransactionOutput, ...]
    consumer_group: str | None = None
    hold_begin: HoldBegin = field(default_factory=HoldBegin)
    _transactional_id_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_transactional_id_re", _compile_glob(self.transactional_id))

    def matches(self, transactional_id: str) -> bool:
        return self._transactional_id_re.match(transactional_id) is not None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "transactional_id": self.transactional_id,
            "outputs": [output.describe() for output in self.outputs],
        }
        if self.consumer_group is not None:
            out["consumer_group"] = self.consumer_group
        out["hold_begin"] = self.hold_begin.describe()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Tracing:
    """The ``tracing`` section: which Kafka APIs get OpenTelemetry spans."""

    enabled: bool = TRACING_ENABLED_DEFAULT
    # API keys by number (0..32767) or by Kafka API name, e.g. "Produce".
    api_keys: tuple[int | str, ...] = DEFAULT_TRACED_API_KEYS

    def describe(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "api_keys": list(self.api_keys)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSet:
    """A whole rule file. ``RuleSet()`` is the built-in defaults (an empty file)."""

    source: str = DEFAULT_SOURCE
    version: str = DEFAULT_VERSION
    limits: Limits = field(default_factory=Limits)
    coalescing: CoalescingRules = field(default_factory=CoalescingRules)
    transactions: tuple[TransactionRule, ...] = ()
    tracing: Tracing = field(default_factory=Tracing)

    def transaction_rule_for(self, transactional_id: str) -> TransactionRule | None:
        """The first ``transactions`` entry whose glob matches, or None."""
        for rule in self.transactions:
            if rule.matches(transactional_id):
                return rule
        return None

    def describe(self) -> dict[str, Any]:
        """The effective configuration, defaults filled in, as plain dicts/lists/scalars.

        Apart from ``source`` and ``version`` (which describe the file, not its contents)
        the result is itself a valid rule file: dumping it with ``yaml.safe_dump`` and
        parsing it again gives an equal ``RuleSet``.
        """
        return {
            "source": self.source,
            "version": self.version,
            "limits": self.limits.describe(),
            "coalescing": self.coalescing.describe(),
            "transactions": [rule.describe() for rule in self.transactions],
            "tracing": self.tracing.describe(),
        }
