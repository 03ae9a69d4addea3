"""The fault stack: Tansu advertising a FaultRelay, the relay, and `kipside serve` in front of
the relay (restartable on its ports); and the rule file the transactional scenarios give it."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from relaykit.faults import FaultRelay
from relaykit.tansu import tansu_behind
from testkit.broker import TANSU_NODE_ID, Broker
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import Metrics, scrape
from testkit.ports import free_port

T = TypeVar("T")


@dataclass
class FaultStack:
    """Tansu advertising the relay, the relay in front of it, kipside in front of the relay."""

    relay: FaultRelay
    broker: Broker  # the real Tansu; only the audit dials it (broker.bootstrap) directly
    admin_port: int
    workdir: Path
    rules: Path | None
    extra_args: tuple[str, ...]
    starts: int = 0
    _kipside: Kipside | None = None

    @property
    def kipside(self) -> Kipside:
        assert self._kipside is not None, "kipside was never started"
        return self._kipside

    @property
    def bootstrap(self) -> str:
        """What the clients dial: kipside."""
        return self.kipside.bootstrap

    def metrics(self) -> Metrics:
        return scrape(self.admin_port)

    def lane_failures(self) -> float:
        """Upstream lanes kipside has lost so far (kipside_lane_failures_total)."""
        return self.metrics().value("kipside_lane_failures_total")

    def inject(self, fault: Callable[[], T], seconds: float, lift: Callable[[], object]) -> T:
        """Start a relay fault (relay.cut, blackhole, stall, spike), keep it `seconds`, then
        lift it (relay.restore, resume, calm); returns what starting it returned."""
        started = fault()
        time.sleep(seconds)
        lift()
        return started

    def inject_marked(
        self,
        fault: Callable[[], object],
        seconds: float,
        lift: Callable[[], object],
        settle_s: float,
    ) -> tuple[float, int]:
        """Let traffic settle `settle_s`, note the lane failures so far and a mark in kipside's
        log, inject the fault (as inject), then let traffic settle 1.5 x `settle_s`; returns the
        failures and the mark, so that what this fault did can be told from what came before."""
        time.sleep(settle_s)
        failures = self.lane_failures()
        mark = self.kipside.log_mark()
        self.inject(fault, seconds, lift)
        time.sleep(settle_s * 1.5)
        return failures, mark

    def restart(self, how: signal.Signals, down_for: float = 0.0) -> int:
        """Stop kipside with `how` (SIGTERM: graceful, must exit 0; SIGKILL), wait `down_for`
        seconds, start it again on the same ports; returns the old process's exit code."""
        old = self.kipside
        old.proc.send_signal(how)
        code = old.proc.wait(timeout=15)
        if how == signal.SIGTERM:
            assert code == 0, f"kipside exited {code} after SIGTERM:\n{old.log()[-3000:]}"
        time.sleep(down_for)
        self.start(old.port, next(iter(old.node_ports.values())) - TANSU_NODE_ID)
        return code

    def start(self, listen: int | None = None, node_base: int | None = None) -> Kipside:
        """Start kipside (on these ports, if given) in front of the relay."""
        self.starts += 1
        self._kipside = start_kipside(
            dataclasses.replace(self.broker, port=self.relay.port),  # kipside dials the relay
            self.workdir / f"kipside-{self.starts}",
            rules=self.rules,
            extra_args=["--admin", f"127.0.0.1:{self.admin_port}", *self.extra_args],
            listen_port=listen,
            node_port_base=node_base,
        )
        return self._kipside


@contextlib.contextmanager
def fault_stack(
    tmp_path: Path,
    rules: str = "",
    extra_args: Iterable[str] = (),
    relay: FaultRelay | None = None,
) -> Iterator[FaultStack]:
    """The stack, with `rules` (YAML text; empty: defaults), more `kipside serve` args and a
    FaultRelay (a FaultRelay() unless given: a subclass may simulate more).

    On exit kipside gets SIGTERM and must exit 0, and the relay must have seen only readable
    Kafka: a relay problem (a frame cut in half, an answer to nothing) fails the test.
    """
    relay = relay if relay is not None else FaultRelay()
    rules_path = None
    if rules:
        rules_path = tmp_path / "rules.yaml"
        rules_path.write_text(rules)
    with tansu_behind(relay) as tansu:
        stack = FaultStack(relay, tansu, free_port(), tmp_path, rules_path, (*extra_args,))
        try:
            stack.start()
            yield stack
            code = stack.kipside.stop()
            assert code == 0, f"kipside exited {code} on SIGTERM:\n{stack.kipside.log()[-3000:]}"
            assert not relay.problems(), relay.problems()
        finally:
            if stack._kipside is not None and stack._kipside.proc.poll() is None:
                stack._kipside.proc.kill()


def transaction_rules(*rules: tuple[str, str, str], hold_max_ms: int | None = 3000) -> str:
    """A rule file pre-registering, per (transactional id glob, output topic, group), that
    output and group; the begin hold at most `hold_max_ms` (None: the rules' default)."""
    hold = "" if hold_max_ms is None else f"    hold_begin: {{max_ms: {hold_max_ms}}}\n"
    return "transactions:\n" + "".join(
        f"  - transactional_id: {glob!r}\n"
        f"    outputs: [{{topic: {output}}}]\n"
        f"    consumer_group: {group}\n{hold}"
        for glob, output, group in rules
    )
