"""The partitions a transaction rule declares, as pre-registration adds them.

A declared topic without partitions means all of its partitions, read with Metadata and cached
for METADATA_TTL_SECONDS. A declared output the broker refuses (unknown, unauthorized) is the
rule's fault, not the client's: it is reported once per rule, left out for a while, and never
fails the client's transaction.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from kipside.protocol import ApiKey, DecodeError, ErrorCode, error_name
from kipside.proxy.core.answers import UpstreamFailed
from kipside.proxy.stages.transactions.messages import (
    METADATA_VERSION,
    metadata_request,
    topic_partitions,
)
from kipside.proxy.stages.transactions.state import TopicPartition
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.upstream.lanes import LanePool
from kipside.rules import TransactionRule

log = logging.getLogger("kipside.transactions")

NONE: Final = 0
NOT_ATTEMPTED: Final = int(ErrorCode.operation_not_attempted)
# Errors on a declared-only partition that mean the rule, not the client, is at fault.
RULE_PROBLEM_ERRORS: Final = frozenset(
    {
        int(ErrorCode.unknown_topic_or_partition),
        int(ErrorCode.topic_authorization_failed),
        NOT_ATTEMPTED,
        int(ErrorCode.invalid_topic_exception),
    }
)
METADATA_TTL_SECONDS: Final = 30.0


def rule_at_fault(result: dict[TopicPartition, int], declared: set[TopicPartition]) -> bool:
    """Whether the declared-only partitions alone failed an AddPartitionsToTxn, for a reason
    the rule is to blame for."""
    declared_codes = {result.get(tp, NONE) for tp in declared} - {NONE}
    return (
        bool(declared_codes)
        and declared_codes <= RULE_PROBLEM_ERRORS
        and any(result.get(tp) in RULE_PROBLEM_ERRORS - {NOT_ATTEMPTED} for tp in declared)
    )


class DeclaredOutputs:
    """The declared outputs of the transaction rules, as the broker knows them."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._topic_partitions: dict[str, tuple[float, tuple[int, ...] | None]] = {}
        self._refused: dict[TopicPartition, float] = {}
        self._reported: set[str] = set()

    async def usable(self, pool: LanePool, rule: TransactionRule) -> set[TopicPartition]:
        """The rule's declared partitions, less those the broker refused lately."""
        out = await self._all(pool, rule)
        now = trio.current_time()
        return {
            tp
            for tp in out
            if now - self._refused.get(tp, -METADATA_TTL_SECONDS) >= METADATA_TTL_SECONDS
        }

    def refuse(
        self,
        rule: TransactionRule,
        result: dict[TopicPartition, int],
        declared: set[TopicPartition],
    ) -> set[TopicPartition]:
        """The declared outputs the broker refused: remembered, and reported once per rule."""
        refused = {tp for tp in declared if result.get(tp) not in (None, NONE, NOT_ATTEMPTED)}
        now = trio.current_time()
        for tp in refused:
            self._refused[tp] = now
        self.stats.rule_problems += 1
        bad = sorted(f"{t}-{p} ({error_name(result[(t, p)])})" for t, p in refused)
        key = f"{rule.transactional_id}:{','.join(bad)}"
        if key not in self._reported:
            self._reported.add(key)
            log.warning(
                "transactions rule %r declares outputs the broker refused: %s; they are left "
                "out of pre-registration for %g s. Fix the rule file's outputs",
                rule.transactional_id,
                ", ".join(bad),
                METADATA_TTL_SECONDS,
            )
        return refused

    async def _all(self, pool: LanePool, rule: TransactionRule) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for output in rule.outputs:
            if output.partitions is not None:
                out.update((output.topic, p) for p in output.partitions)
                continue
            partitions = await self._partitions_of(pool, output.topic)
            if partitions is None:
                self._report_missing(rule, output.topic)
                continue
            out.update((output.topic, p) for p in partitions)
        return out

    def _report_missing(self, rule: TransactionRule, topic: str) -> None:
        key = f"{rule.transactional_id}:{topic}:missing"
        if key not in self._reported:
            self._reported.add(key)
            self.stats.rule_problems += 1
            log.warning(
                "transactions rule %r declares topic %r, which the broker does not "
                "know; it is left out of pre-registration. Fix the rule file's outputs",
                rule.transactional_id,
                topic,
            )

    async def _partitions_of(self, pool: LanePool, topic: str) -> tuple[int, ...] | None:
        cached = self._topic_partitions.get(topic)
        now = trio.current_time()
        if cached is not None and now - cached[0] < METADATA_TTL_SECONDS:
            return cached[1]
        try:
            frame = await pool.request(metadata_request(topic), ApiKey.METADATA, METADATA_VERSION)
            partitions = topic_partitions(frame, topic)
        except (UpstreamFailed, DecodeError) as exc:
            log.warning("cannot read partitions of %r: %s", topic, exc)
            return cached[1] if cached is not None else None
        self._topic_partitions[topic] = (now, partitions)
        return partitions
