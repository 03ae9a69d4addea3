"""The processes of a benchmark: brokers, the proxies in front of them, and which kipside runs.

A *stack* is one path from a client to a fresh in-memory Tansu: `direct`; through kipside (the
installed code, a snapshot of the working tree, or the tree of a baseline git ref); through
`tansu proxy` (Tansu's Rust proxy); through haproxy in plain TCP mode (the floor for any proxy);
through the bare trio relay (bench/_relay.py, the floor for a proxy in Python on trio).
`open_stack()` starts one and stops it again. A tests/relaykit relay may stand before Tansu.

Loopback only. Never edits the checkout: snapshots and baseline trees are copies in directories
the caller owns. Brokers, ports, CPU readings and child tracking come from tests/testkit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from testkit import procs, tools  # noqa: E402
from testkit.broker import TANSU_NODE_ID, start_tansu  # noqa: E402
from testkit.cpu import tree_cpu_seconds  # noqa: E402
from testkit.ports import (  # noqa: E402
    LOOPBACK,
    PortNotListening,
    free_port,
    wait_for_port,
)

from kipside.proxy.devbroker import tansu_path  # noqa: E402

HOST = LOOPBACK
PATHS = ("direct", "kipside", "tansu-proxy", "haproxy", "relay")
"""Every path a stack can take; any path named `kipside...` runs kipside (see KipsideCode)."""
PACKAGES = ("protocol", "proxy", "rules", "pipeline")
LOG_PROBLEMS = ("ERROR", "CRITICAL", "WARNING", "Traceback", "panicked")


class HarnessError(RuntimeError):
    """A process of the benchmark could not be started or misbehaved."""


@dataclass
class Managed:
    """A started process, its log file (stdout and stderr) and its CPU accounting."""

    name: str
    popen: subprocess.Popen[Any]
    log: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        with contextlib.suppress(psutil.Error):
            return int(psutil.Process(self.pid).memory_info().rss)
        return 0

    def check_alive(self) -> None:
        if (code := self.popen.poll()) is not None:
            raise HarnessError(f"{self.name} exited with code {code}{self.log_tail()}")

    def lines(self) -> list[str]:
        if self.log is None or not self.log.exists():
            return []
        return self.log.read_text(errors="replace").splitlines()

    def log_tail(self, count: int = 20) -> str:
        tail = self.lines()[-count:]
        return f"\n--- {self.name} log tail ---\n" + "\n".join(tail) if tail else ""

    def problems(self) -> list[str]:
        """The lines of its log that report a warning, an error or a crash."""
        return [line for line in self.lines() if any(w in line for w in LOG_PROBLEMS)]

    def stop(self) -> None:
        procs.stop(self.popen)


def spawn(
    name: str, args: Sequence[str], logdir: Path, env: dict[str, str] | None = None
) -> Managed:
    log = logdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(args), stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env
        )
    return Managed(name, procs.track(popen), log)


def listening(proc: Managed, *ports: int, timeout: float = 20.0) -> None:
    """Return once `proc` listens on every port; stop it and raise if it never does."""
    try:
        for port in ports:
            wait_for_port(port, timeout=timeout, process=proc.popen, name=proc.name)
    except PortNotListening as exc:
        proc.stop()
        raise HarnessError(f"{exc}{proc.log_tail()}") from None


# --------------------------------------------------------------------------- kipside's code


@dataclass(frozen=True)
class KipsideCode:
    """Which kipside a stack runs: the installed one, or a tree put first on PYTHONPATH.

    `module` is the tree's CLI: `kipside.proxy.cli` since the kipside.* namespace, `proxy.cli`
    in the older flat layout (top-level `proxy`, `protocol`, `rules`).
    """

    label: str
    pythonpath: Path | None = None
    module: str = "kipside.proxy.cli"

    def command(self, *args: str) -> list[str]:
        main = f"import sys; from {self.module} import main; sys.exit(main())"
        return [sys.executable, "-c", main, *args]

    def env(self) -> dict[str, str] | None:
        if self.pythonpath is None:
            return None
        old = os.environ.get("PYTHONPATH")
        return dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(self.pythonpath), old]))
        )

    def checked(self) -> KipsideCode:
        """Itself, once `serve --help` works; HarnessError with the reason otherwise."""
        done = subprocess.run(
            self.command("serve", "--help"),
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env(),
        )
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
            raise HarnessError(f"kipside ({self.label}) does not start: {err[-1]}")
        return self


INSTALLED = KipsideCode("installed")


def code_of_tree(tree: Path, dest: Path, label: str) -> KipsideCode:
    """The kipside in `tree` (a checkout's top level), in whichever layout it has."""
    if "from kipside." not in (tree / "proxy" / "cli.py").read_text():
        return KipsideCode(label, tree, "proxy.cli").checked()
    (dest / "kipside").mkdir(parents=True, exist_ok=True)
    for pkg in PACKAGES:
        if (tree / pkg).is_dir() and not (dest / "kipside" / pkg).exists():
            (dest / "kipside" / pkg).symlink_to(tree / pkg, target_is_directory=True)
    return KipsideCode(label, dest).checked()


def snapshot(dest: Path, attempts: int = 3) -> KipsideCode:
    """A copy of the working tree's packages, so every run of a long benchmark runs the same
    code while others edit the checkout; taken again if a file was caught mid-edit."""
    for attempt in range(attempts):  # again if a file was caught mid-edit
        shutil.rmtree(dest, ignore_errors=True)
        digest = hashlib.sha256()
        for pkg in PACKAGES:
            skip = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / pkg, dest / "tree" / pkg, ignore=skip)
        for f in sorted((dest / "tree").rglob("*.py")):
            digest.update(f.relative_to(dest).as_posix().encode() + b"\0" + f.read_bytes())
        label = f"working tree (snapshot, sha256 of sources {digest.hexdigest()[:12]})"
        try:
            return code_of_tree(dest / "tree", dest / "path", label)
        except HarnessError:
            if attempt + 1 == attempts:
                raise
            time.sleep(10)
    raise AssertionError("unreachable")


def at_ref(ref: str, dest: Path) -> KipsideCode:
    """kipside as of git `ref`: its whole tree (the CLI's entry points load pipeline/ too)."""
    commit = _git("rev-parse", "--short=12", f"{ref}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=io.BytesIO(_git("archive", "--format=tar", commit))) as tar:
        tar.extractall(dest / "tree", filter="data")
    return code_of_tree(dest / "tree", dest / "path", f"{ref} (commit {commit})")


def _git(*args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)
    if done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


# --------------------------------------------------------------------------- proxies


def start_kipside(
    logdir: Path, upstream: int, code: KipsideCode, extra: Sequence[str] = ()
) -> tuple[Managed, int]:
    """`kipside serve` in front of HOST:upstream; Tansu's node gets a listener of its own."""
    listen, node = free_port(), free_port()
    args = ["--upstream", f"{HOST}:{upstream}", "--listen", f"{HOST}:{listen}"]
    args += ["--node-port-base", str(node - TANSU_NODE_ID), *extra]
    proc = spawn("kipside", code.command("serve", *args), logdir, env=code.env())
    listening(proc, listen, node)
    return proc, listen


HAPROXY = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend kafka
    bind {host}:{listen}
    default_backend broker
backend broker
    server tansu {host}:{origin}
"""


def start_proxy(kind: str, logdir: Path, origin: int, port: int | None) -> tuple[Managed, int]:
    """`tansu proxy`, haproxy (TCP mode) or the bare trio relay in front of HOST:origin."""
    port = port or free_port()
    if kind == "tansu-proxy":
        me, there = f"tcp://{HOST}:{port}", f"tcp://{HOST}:{origin}"
        args = [str(tansu_path()), "proxy", "--listener-url", me, "--advertised-listener-url", me]
        args += ["--origin-url", there]
    elif kind == "haproxy":
        cfg = logdir / "haproxy.cfg"
        cfg.write_text(HAPROXY.format(host=HOST, listen=port, origin=origin))
        args = [tools.find("haproxy", "the benchmarks' floor"), "-db", "-f", str(cfg)]
    else:
        args = [sys.executable, str(REPO / "bench" / "_relay.py"), str(port), str(origin)]
    proc = spawn(kind, args, logdir)
    listening(proc, port)
    return proc, port


# --------------------------------------------------------------------------- stacks


@dataclass
class Stack:
    """One client path to a fresh broker: what clients bootstrap from and what to watch."""

    path: str
    bootstrap: str
    broker: Managed
    broker_port: int
    proxy: Managed | None
    logdir: Path

    def check_alive(self) -> None:
        for proc in (self.broker, self.proxy):
            if proc is not None:
                proc.check_alive()


@contextlib.contextmanager
def open_stack(
    path: str,
    logdir: Path,
    *,
    kipside_args: Sequence[str] = (),
    code: KipsideCode = INSTALLED,
    relay: Any = None,
) -> Iterator[Stack]:
    """Start a fresh Tansu and, unless `path` is direct, the proxy in front of it.

    `kipside_args` go to `kipside serve` on kipside paths. With `relay`, Tansu advertises the
    relay and the proxy (or a direct client) talks to the relay. A plain TCP relay (haproxy,
    the trio relay) cannot rewrite metadata, so Tansu advertises its port instead.
    """
    kind = "kipside" if path.startswith("kipside") else path
    if kind not in PATHS:
        raise ValueError(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    plain = free_port() if kind in ("haproxy", "relay") else None
    with contextlib.ExitStack() as stack:
        broker = start_tansu(advertised_port=relay.port if relay is not None else plain)
        stack.callback(broker.close)
        origin = broker.port
        if relay is not None:
            relay.upstream, origin = (HOST, broker.port), relay.port
        proxy, port = None, origin
        if kind == "kipside":
            proxy, port = start_kipside(logdir, origin, code, kipside_args)
        elif kind != "direct":
            proxy, port = start_proxy(kind, logdir, origin, plain)
        if proxy is not None:
            stack.callback(proxy.stop)
        tansu = Managed("tansu", broker.proc)
        yield Stack(path, f"{HOST}:{port}", tansu, broker.port, proxy, logdir)
