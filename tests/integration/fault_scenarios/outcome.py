"""What a fault scenario returns (the load it held, the faults, the result line and its
checks), and the parts of the scenarios' scales several of them share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..fault_kit.loads import SequencedProducer

Namer = Callable[[str], str]
"""A unique Kafka name for a prefix (topics, groups, transactional ids of one run)."""


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool
    detail: str = ""


@dataclass
class Outcome:
    """What one scenario held, injected and found."""

    load: str
    faults: str
    result: str = ""
    checks: list[Check] = field(default_factory=list)

    def check(self, what: str, ok: bool, detail: object = "") -> None:
        self.checks.append(Check(what, bool(ok), str(detail)))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def assert_ok(self) -> None:
        failed = [f"{c.what}: {c.detail}" for c in self.checks if not c.ok]
        # The failed checks come first: CI's summary shows an assertion's first line only.
        assert not failed, "failed checks: " + "; ".join(failed) + f"\n{self.result}"


def producers_told(outcome: Outcome, producers: list[SequencedProducer]) -> None:
    for p in producers:
        outcome.check(
            f"{p.name} had no failed delivery", not p.delivered.failed, p.delivered.failed[:3]
        )
        outcome.check(f"{p.name} heard about every message", p.unflushed == 0, p.unflushed)


@dataclass(frozen=True)
class Producers:
    """Idempotent confluent-kafka producers (SequencedProducer) writing one topic."""

    count: int = 2
    rate: float = 150.0  # messages a second, per producer

    def __str__(self) -> str:
        return f"{self.count} idempotent confluent-kafka producers, {self.rate:g} msg/s each"

    def make(
        self, bootstrap: str, topic: str, partitions: int, **conf: Any
    ) -> list[SequencedProducer]:
        """The producers ck0, ck1, ... (not started) with these librdkafka settings."""
        return [
            SequencedProducer(f"ck{i}", bootstrap, topic, partitions, self.rate, **conf)
            for i in range(self.count)
        ]


@dataclass(frozen=True)
class Timeouts:
    """How long an answer may take: kipside's --upstream-request-timeout, and the producers'
    request.timeout.ms (the timeout_ms of their ProduceRequests, which kipside honours when it
    is longer)."""

    answer_s: float = 1.0
    request_ms: int = 3000

    def __str__(self) -> str:
        return f"--upstream-request-timeout {self.answer_s:g}, request.timeout.ms {self.request_ms}"

    def kipside_args(self) -> list[str]:
        return ["--upstream-request-timeout", str(self.answer_s)]

    def producer_conf(self) -> dict[str, Any]:
        return {"request.timeout.ms": self.request_ms}

    def allowance(self, api: str) -> float:
        """How long kipside waits for the answer to a request of `api` before closing its lane."""
        if api == "Produce":
            return max(self.answer_s, self.request_ms / 1000)
        return self.answer_s
