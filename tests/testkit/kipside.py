"""`kipside serve` as the tests run it: started in front of a broker (or a simulated cluster),
ready once it prints `kipside: ready` and its announced listeners match the ports it was given.

    ks = start_kipside(broker, workdir)        # free ports; rules, extra args, node ids optional
    produce_to(ks.bootstrap)
    assert ks.stop() == 0                      # SIGTERM; it must exit within STOP_TIMEOUT
    dev = start_kipside_dev(workdir)           # `kipside dev`: its own Tansu, kipside in front

It runs the venv's `kipside` (KIPSIDE_BIN; `binary` and `env` run another install's, e.g. a
fresh venv's), adds KIPSIDE_TEST_SERVE_ARGS to every `serve` command line, and keeps both logs
in the caller's directory: stderr (`Kipside.log()`, `wait_for_log`) and stdout (the ready and
listening lines). Every process is tracked (testkit.procs) and every
stderr log listed (`started_logs()`), so a watchdog can kill them and show the logs' tails.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import procs
from .broker import TANSU_NODE_ID
from .ports import free_port

__all__ = [
    "KIPSIDE_BIN",
    "READY_TIMEOUT",
    "STOP_TIMEOUT",
    "Kipside",
    "KipsideError",
    "Upstream",
    "start_kipside",
    "start_kipside_dev",
    "started_logs",
    "tail",
]

REPO = Path(__file__).resolve().parents[2]
KIPSIDE_BIN = REPO / ".venv" / "bin" / "kipside"
READY_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0

_LOGS: list[Path] = []  # kipside stderr logs, shown by a watchdog


def started_logs() -> list[Path]:
    """The stderr log of every kipside started so far (a watchdog shows their tails)."""
    return list(_LOGS)


_NODE_LINE = re.compile(
    r"^kipside: node (\d+) listening on ([\d.]+):(\d+) -> upstream ([\w.\-]+):(\d+)$"
)
_BOOTSTRAP_LINE = re.compile(r"^kipside: bootstrap listening on ([\d.]+):(\d+)$")
_EMBEDDED_LINE = re.compile(r"^kipside: embedded Tansu broker on ([\d.]+:\d+) \(in-memory\)$")


class KipsideError(RuntimeError):
    """kipside did not start or did not stop as its CLI contract says."""


@dataclass
class Kipside:
    """A running `kipside serve` process."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    node_ports: dict[int, int]
    upstream: str
    log_path: Path
    stdout_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ports(self) -> set[int]:
        """Every port kipside listens on (bootstrap and per-node)."""
        return {self.port, *self.node_ports.values()}

    def log(self) -> str:
        """Everything kipside wrote to stderr so far."""
        return self.log_path.read_text(errors="replace")

    def log_mark(self) -> int:
        """A position in the log; pass it to log_since() to see only what came after."""
        return self.log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        with self.log_path.open("rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    def wait_for_log(
        self, predicate: Callable[[str], object], mark: int = 0, timeout: float = 5.0
    ) -> list[str]:
        """Wait until some log line after `mark` satisfies predicate; return those lines."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [ln for ln in self.log_since(mark).splitlines() if predicate(ln)]
            if lines:
                return lines
            if time.monotonic() > deadline:
                return []
            time.sleep(0.05)

    def assert_alive(self) -> None:
        if self.proc.poll() is not None:
            raise KipsideError(
                f"kipside exited with code {self.proc.returncode}; log tail:\n" + tail(self.log())
            )

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, wait up to `timeout` s; return the exit code (kills it if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                self.proc.kill()
                self.proc.wait(timeout=5)
                raise KipsideError(
                    f"kipside did not exit within {timeout} s of SIGTERM; log tail:\n"
                    + tail(self.log())
                ) from exc
        return self.proc.returncode


def tail(text: str, lines: int = 40) -> str:
    """The last `lines` lines of `text` (of a log, for an error message)."""
    return "\n".join(text.splitlines()[-lines:])


class Upstream(Protocol):
    """What kipside is put in front of: a Broker, or a relaykit.cluster.SimulatedCluster."""

    @property
    def bootstrap(self) -> str:
        """Its bootstrap address(es), comma-separated: kipside's --upstream."""


def _node_port_base(nodes: Collection[int]) -> int:
    """A --node-port-base whose ports for `nodes`, and for one more node id above them (a
    node joining), are all free now."""
    ids = range(min(nodes), max(nodes) + 2)
    for _ in range(50):
        base = free_port() - min(nodes)
        try:
            for node_id in ids[1:]:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", base + node_id))
        except OSError:
            continue
        return base
    raise KipsideError(f"found no free run of ports for nodes {sorted(nodes)}")


def start_kipside(
    upstream: Upstream,
    workdir: Path,
    rules: Path | None = None,
    timeout: float = READY_TIMEOUT,
    extra_args: Sequence[str] = (),
    nodes: Collection[int] = (TANSU_NODE_ID,),
    listen_port: int | None = None,
    node_port_base: int | None = None,
    binary: Path = KIPSIDE_BIN,
    env: Mapping[str, str] | None = None,
) -> Kipside:
    """Start `kipside serve` in front of `upstream` and wait for its `kipside: ready` line.

    extra_args go to `kipside serve` after those from KIPSIDE_TEST_SERVE_ARGS. `nodes` are the
    upstream node ids kipside must announce a listener for (Tansu alone is node 111).
    `listen_port` and `node_port_base` (free ones by default) let a test start kipside again
    on the ports an earlier one had (a restart). `binary` and `env` (this process's environment
    by default) run another installation's `kipside`.
    """
    listen = free_port() if listen_port is None else listen_port
    base = _node_port_base(nodes) if node_port_base is None else node_port_base
    args = _serve_args(binary, upstream, listen, base, rules, extra_args)
    return _start(args, workdir, listen, base, nodes, timeout, env, upstream.bootstrap)


def start_kipside_dev(
    workdir: Path,
    timeout: float = READY_TIMEOUT,
    binary: Path = KIPSIDE_BIN,
    env: Mapping[str, str] | None = None,
) -> Kipside:
    """Start `kipside dev` (its embedded Tansu, kipside in front) on free loopback ports, its
    admin endpoint included, and wait for its `kipside: ready` line. The returned Kipside's
    upstream is the embedded broker; stop() (SIGTERM) stops both."""
    listen, base = free_port(), _node_port_base((TANSU_NODE_ID,))
    args = [str(binary), "dev", "--listen", f"127.0.0.1:{listen}", "--node-port-base", str(base)]
    args += ["--admin", f"127.0.0.1:{free_port()}"]
    return _start(args, workdir, listen, base, (TANSU_NODE_ID,), timeout, env, None)


def _start(
    args: Sequence[str],
    workdir: Path,
    listen: int,
    base: int,
    nodes: Collection[int],
    timeout: float,
    env: Mapping[str, str] | None,
    upstream: str | None,
) -> Kipside:
    """Run `args`, wait until ready and check the announced listeners. `upstream` is what the
    node lines must point at; None: the embedded broker that `kipside dev` announces."""
    if not Path(args[0]).exists():
        raise KipsideError(f"{args[0]} is missing: pip install -e . in the venv")
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "kipside.stderr.log"
    stdout_path = workdir / "kipside.stdout.log"
    with log_path.open("wb") as err, stdout_path.open("wb") as out:
        proc = procs.track(
            subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=None if env is None else dict(env),
            )
        )
    _LOGS.append(log_path)
    out_text = _wait_until_ready(proc, args, stdout_path, log_path, timeout)
    if upstream is None:
        upstream = _embedded_broker(out_text)
    node_ports, bootstrap = _announced_listeners(out_text, upstream)
    ks = Kipside(
        proc=proc,
        host="127.0.0.1",
        port=listen,
        node_ports=node_ports,
        upstream=upstream,
        log_path=log_path,
        stdout_path=stdout_path,
    )
    problems = _announcement_problems(bootstrap, node_ports, listen, base, nodes)
    if problems:
        ks.stop()
        raise KipsideError("; ".join(problems) + f"\nstdout:\n{out_text}")
    return ks


def _embedded_broker(out_text: str) -> str:
    """The address of the broker `kipside dev` says it started."""
    for line in out_text.splitlines():
        if m := _EMBEDDED_LINE.match(line):
            return m.group(1)
    raise KipsideError(f"kipside dev named no embedded broker:\n{out_text}")


def _serve_args(
    binary: Path,
    upstream: Upstream,
    listen: int,
    base: int,
    rules: Path | None,
    extra_args: Sequence[str],
) -> list[str]:
    """The `kipside serve` command line: ours, then KIPSIDE_TEST_SERVE_ARGS, then the test's."""
    args = [
        str(binary),
        "serve",
        "--upstream",
        upstream.bootstrap,
        "--listen",
        f"127.0.0.1:{listen}",
        "--node-port-base",
        str(base),
    ]
    if rules is not None:
        args += ["--rules", str(rules)]
    args += shlex.split(os.environ.get("KIPSIDE_TEST_SERVE_ARGS", ""))
    args += list(extra_args)
    return args


def _wait_until_ready(
    proc: subprocess.Popen[bytes],
    args: Sequence[str],
    stdout_path: Path,
    log_path: Path,
    timeout: float,
) -> str:
    """Wait for the `kipside: ready` line and return stdout so far; if kipside exits first or
    takes longer than `timeout`, kill it and raise with both logs' tails."""
    deadline = time.monotonic() + timeout
    while True:
        out_text = stdout_path.read_text(errors="replace")
        if "kipside: ready" in out_text.splitlines():
            return out_text
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with code {proc.returncode}"
                if proc.poll() is not None
                else f"not ready after {timeout} s"
            )
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
            raise KipsideError(
                f"kipside {why}: {' '.join(args)}\nstdout:\n{tail(out_text)}\n"
                f"stderr:\n{tail(log_path.read_text(errors='replace'))}"
            )
        time.sleep(0.02)


def _announced_listeners(
    out_text: str, upstream: str
) -> tuple[dict[int, int], tuple[str, int] | None]:
    """The node listeners (node id -> port) and the bootstrap address kipside's stdout names;
    every node line must point at one of the `upstream` addresses (comma-separated)."""
    node_ports: dict[int, int] = {}
    bootstrap: tuple[str, int] | None = None
    for line in out_text.splitlines():
        if m := _NODE_LINE.match(line):
            node_ports[int(m.group(1))] = int(m.group(3))
            assert f"{m.group(4)}:{m.group(5)}" in upstream.split(","), line
        elif m := _BOOTSTRAP_LINE.match(line):
            bootstrap = (m.group(1), int(m.group(2)))
    return node_ports, bootstrap


def _announcement_problems(
    bootstrap: tuple[str, int] | None,
    node_ports: dict[int, int],
    listen: int,
    base: int,
    nodes: Collection[int],
) -> list[str]:
    """How the announced listeners differ from the ports kipside was told to use."""
    problems = []
    if bootstrap != ("127.0.0.1", listen):
        problems.append(f"bootstrap line says {bootstrap}, expected 127.0.0.1:{listen}")
    if node_ports != (expected := {node_id: base + node_id for node_id in nodes}):
        problems.append(f"node lines say {node_ports}, expected {expected}")
    return problems
