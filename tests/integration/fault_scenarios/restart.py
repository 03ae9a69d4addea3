"""kipside restarts mid-traffic: SIGTERM, then SIGKILL, each started again on the same ports."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import create_topics

from ..fault_kit.audit import acked_of, audit
from ..fault_kit.loads import KafkaPythonProducer, run_producers
from ..fault_kit.stack import fault_stack
from .outcome import Namer, Outcome, Producers, producers_told


@dataclass(frozen=True)
class RestartScale:
    partitions: int = 4
    producers: Producers = field(default_factory=Producers)  # + an at-least-once kafka-python
    between_s: float = 1.5
    down_s: float = 0.5
    restarts: int = 1  # each a SIGTERM, then a SIGKILL


def restarts_mid_traffic(work: Path, name: Namer, s: RestartScale) -> Outcome:
    """kipside stopped with SIGTERM, then SIGKILL (each started again on the same ports) while
    idempotent confluent-kafka producers and an at-least-once kafka-python producer write."""
    out = Outcome(
        f"{s.producers} + 1 kafka-python producer (acks=all, retries, no idempotence) at the "
        "same rate",
        f"kipside SIGTERM, then SIGKILL, x{s.restarts}, each down {s.down_s:g} s, restarted on "
        "the same ports",
    )
    with fault_stack(work) as stack:
        topic = name("restart")
        create_topics(stack.bootstrap, [topic], s.partitions)
        producers = s.producers.make(stack.bootstrap, topic, s.partitions)
        rate = s.producers.rate
        producers.append(KafkaPythonProducer("kp", stack.bootstrap, topic, s.partitions, rate))
        for p in producers:
            p.run_timeout = 60 + 2 * s.restarts * (s.between_s + s.down_s + 3)
            p.start()
        codes = []
        for _ in range(s.restarts):
            for how in (signal.SIGTERM, signal.SIGKILL):
                time.sleep(s.between_s)
                codes.append(stack.restart(how, down_for=s.down_s))
        time.sleep(s.between_s)
        run_producers(producers, timeout=120)
        stack.kipside.assert_alive()
        result = audit(
            stack.broker.bootstrap, topic, s.partitions, acked_of(producers), at_least_once={"kp"}
        )
    out.result = (
        f"{result.line()}; exit codes {codes}; unacknowledged yet written "
        f"{result.unacknowledged_in_log}"
    )
    producers_told(out, producers)
    out.check("SIGTERM exits 0, SIGKILL kills", codes == [0, -signal.SIGKILL] * s.restarts, codes)
    out.check(
        "every acknowledged message kept; idempotent ones once, in order",
        result.clean,
        result.line(),
    )
    return out
