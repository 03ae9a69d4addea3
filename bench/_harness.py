"""The processes of a benchmark: brokers, the proxies in front of them, and which kipside runs.

A *stack* is one path from a client to a fresh in-memory Tansu: `direct`; through kipside (the
installed code, a snapshot of the working tree, or the tree of a git ref); through `tansu proxy`
(Tansu's Rust proxy); through haproxy in plain TCP mode (the floor for any proxy); through the
bare trio relay (bench/_relay.py, the floor for a proxy in Python on trio). `open_stack()`
starts one and stops it again. A tests/ relay may stand before Tansu.

Loopback only. Never edits the checkout: snapshots and trees of a git ref are copies in
directories the caller owns. Brokers, ports, CPU readings and child tracking come from
tests/testkit.
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from testkit import procs, tools  # noqa: E402
from testkit.broker import TANSU_NODE_ID, start_tansu  # noqa: E402
from testkit.cpu import tree_cpu_seconds  # noqa: E402
from testkit.ports import LOOPBACK, PortNotListening, free_port, wait_for_port  # noqa: E402

from kipside.proxy.devbroker import tansu_path  # noqa: E402

HOST = LOOPBACK
PATHS = ("direct", "kipside", "tansu-proxy", "haproxy", "relay")
"""Every path a stack can take; any path named `kipside...` runs kipside (see KipsideCode)."""
PACKAGES = ("protocol", "proxy", "rules", "pipeline")
PROXY_LOG = "proxy.log"
"""The proxy's stdout and stderr, in the run's log directory."""
PROBLEMS = ("ERROR", "CRITICAL", "WARNING", "Traceback", "panicked")


class HarnessError(RuntimeError):
    """A process of the benchmark could not be started or misbehaved."""


@dataclass
class Managed:
    """A started process, its log file (stdout and stderr) and its CPU accounting."""

    name: str
    popen: subprocess.Popen[Any]
    log: Path | None = None

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.popen.pid)

    def log_tail(self, count: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        tail = self.log.read_text(errors="replace").splitlines()[-count:]
        return f"\n--- {self.name} log tail ---\n" + "\n".join(tail)


def problems(log: Path) -> list[str]:
    """The lines of a log that report a warning, an error or a crash."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line for line in lines if any(word in line for word in PROBLEMS)]


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
        paths = [str(self.pythonpath), os.environ.get("PYTHONPATH", "")]
        return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)))


INSTALLED = KipsideCode("installed")


def code_of_tree(tree: Path, label: str) -> KipsideCode:
    """The kipside in `tree` (a checkout's top level), in whichever layout it has."""
    if "from kipside." not in (tree / "proxy" / "cli.py").read_text():
        return KipsideCode(label, tree, "proxy.cli")
    path = tree.parent / "path"
    (path / "kipside").mkdir(parents=True, exist_ok=True)
    for pkg in PACKAGES:
        if (tree / pkg).is_dir():
            (path / "kipside" / pkg).symlink_to(tree / pkg, target_is_directory=True)
    return KipsideCode(label, path)


def snapshot(dest: Path) -> KipsideCode:
    """A copy of the working tree's packages, so that every run of a long benchmark runs the
    same code while others edit the checkout."""
    digest = hashlib.sha256()
    for pkg in PACKAGES:
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO / pkg, dest / "tree" / pkg, ignore=skip)
    for f in sorted((dest / "tree").rglob("*.py")):
        digest.update(f.relative_to(dest).as_posix().encode() + b"\0" + f.read_bytes())
    label = f"working tree (snapshot, sha256 of sources {digest.hexdigest()[:12]})"
    return code_of_tree(dest / "tree", label)


def at_ref(ref: str, dest: Path) -> KipsideCode:
    """kipside as of git `ref`: its whole tree (the CLI's entry points load pipeline/ too)."""
    commit = git("rev-parse", "--short=12", f"{ref}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=io.BytesIO(git("archive", "--format=tar", commit))) as tar:
        tar.extractall(dest / "tree", filter="data")
    return code_of_tree(dest / "tree", f"{ref} (commit {commit})")


def git(*args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)
    if done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


# --------------------------------------------------------------------------- stacks

HAPROXY = """\
global
    maxconn 4096
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
listen kafka
    bind {host}:{listen}{tls}
    server tansu {host}:{origin}
"""


def haproxy(cfg: Path, listen: int, origin: int, pem: Path | None = None) -> list[str]:
    """The command of haproxy in TCP mode on HOST:listen before HOST:origin, its configuration
    written to `cfg`; with `pem` (certificate and key in one file) it terminates TLS."""
    tls = f" ssl crt {pem}" if pem else ""
    cfg.write_text(HAPROXY.format(host=HOST, listen=listen, origin=origin, tls=tls))
    return [tools.find("haproxy", "the benchmarks' floor and TLS broker"), "-db", "-f", str(cfg)]


def launch(
    name: str, args: Sequence[str], log: Path, ports: Sequence[int], env: Any = None
) -> Managed:
    """Start `args` (stdout and stderr to `log`) and return once it listens on all `ports`."""
    with log.open("wb") as out:
        popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    started = Managed(name, procs.track(popen), log)
    try:
        for p in ports:
            wait_for_port(p, timeout=20.0, process=popen, name=name)
    except PortNotListening as exc:
        procs.stop(popen)
        raise HarnessError(f"{exc}{started.log_tail()}") from None
    return started


def start_proxy(
    kind: str, logdir: Path, origin: int, port: int, code: KipsideCode, kipside_args: Sequence[str]
) -> Managed:
    """The proxy of path `kind` on HOST:port in front of HOST:origin, once it listens (kipside
    also on the listener of Tansu's node)."""
    env, ports = None, [port]
    if kind == "kipside":
        node = free_port()
        args = code.command("serve", "--upstream", f"{HOST}:{origin}", "--listen")
        args += [f"{HOST}:{port}", "--node-port-base", str(node - TANSU_NODE_ID), *kipside_args]
        env, ports = code.env(), [port, node]
    elif kind == "tansu-proxy":
        me, there = f"tcp://{HOST}:{port}", f"tcp://{HOST}:{origin}"
        args = [str(tansu_path()), "proxy", "--listener-url", me, "--advertised-listener-url", me]
        args += ["--origin-url", there]
    elif kind == "haproxy":
        args = haproxy(logdir / "haproxy.cfg", port, origin)
    else:
        args = [sys.executable, str(REPO / "bench" / "_relay.py"), str(port), str(origin)]
    return launch(kind, args, logdir / PROXY_LOG, ports, env)


@dataclass
class Stack:
    """One client path to a fresh broker: what clients bootstrap from and what to watch."""

    path: str
    bootstrap: str
    broker: Managed
    broker_port: int
    proxy: Managed | None
    logdir: Path
    client: dict[str, Any] = field(default_factory=dict)
    """Settings every client of this stack needs, in librdkafka's names (TLS)."""
    admin: int | None = None
    """kipside's admin port (its /metrics), when asked for."""


@contextlib.contextmanager
def open_stack(
    path: str,
    logdir: Path,
    *,
    kipside_args: Sequence[str] = (),
    code: KipsideCode = INSTALLED,
    rules: str | None = None,
    admin: bool = False,
    relay: Any = None,
    client: Mapping[str, Any] | None = None,
) -> Iterator[Stack]:
    """Start a fresh Tansu and, unless `path` is direct, the proxy in front of it.

    On kipside paths: `kipside_args` go to `kipside serve`, `rules` is the text of its rule
    file, `admin` opens its admin listener (Stack.admin). With `relay` (a tests/ relay),
    Tansu advertises the relay and the proxy (or a direct client) talks to the relay. A plain
    TCP proxy (haproxy, the trio relay) cannot rewrite metadata, so Tansu advertises its port.
    `client`: settings every client of the stack needs (TLS toward kipside).
    """
    kind = "kipside" if path.startswith("kipside") else path
    if kind not in PATHS:
        raise ValueError(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    listen, admin_port = free_port(), free_port() if admin and kind == "kipside" else None
    if kind == "kipside" and rules is not None:
        (logdir / "rules.yaml").write_text(rules)
        kipside_args = [*kipside_args, "--rules", str(logdir / "rules.yaml")]
    if admin_port is not None:
        kipside_args = [*kipside_args, "--admin", f"{HOST}:{admin_port}"]
    plain = listen if kind in ("haproxy", "relay") else None
    with contextlib.ExitStack() as stack:
        broker = start_tansu(advertised_port=relay.port if relay is not None else plain)
        stack.callback(broker.close)
        origin = broker.port
        if relay is not None:
            relay.upstream, origin = (HOST, broker.port), relay.port
        proxy, port = None, origin
        if kind != "direct":
            proxy = start_proxy(kind, logdir, origin, listen, code, kipside_args)
            stack.callback(procs.stop, proxy.popen)
            port = listen
        tansu = Managed("tansu", broker.proc)
        client = dict(client or {})
        yield Stack(path, f"{HOST}:{port}", tansu, broker.port, proxy, logdir, client, admin_port)
