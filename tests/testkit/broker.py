"""The in-memory Tansu broker of the tests and benchmarks, started through kipside.proxy.devbroker
(the product's own way, the one `kipside dev` uses), and the version of that broker.

    with start_tansu() as broker:              # a fresh broker on a free loopback port
        produce_to(broker.bootstrap)
    relay_broker = start_tansu(advertised_port=relay.port)   # clients learn the relay's address

Tansu keeps everything in memory: a restart loses its data.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass, field
from types import TracebackType

from kipside.proxy.devbroker import start_tansu as _devbroker_start
from kipside.proxy.devbroker import tansu_path

from . import procs
from .ports import LOOPBACK

__all__ = ["TANSU_0_6_0", "TANSU_NODE_ID", "Broker", "start_tansu", "tansu_version"]

TANSU_NODE_ID = 111  # Tansu presents every broker as node 111; it has no node-id option


@dataclass(frozen=True)
class Broker:
    """A running broker as clients see it: `bootstrap` is what they dial."""

    host: str
    port: int
    pid: int
    proc: subprocess.Popen[bytes] = field(repr=False, compare=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self, timeout: float = 5.0) -> None:
        """SIGTERM the broker, SIGKILL it after `timeout` s."""
        procs.stop(self.proc, timeout)

    def __enter__(self) -> Broker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_tansu(*, port: int = 0, advertised_port: int | None = None) -> Broker:
    """Start an in-memory Tansu on loopback (a free port unless `port`) and return once it
    listens. It advertises `advertised_port` (a relay in front of it) or its own port; the
    returned Broker's port is always the broker's real listener."""
    proc, real_port = _devbroker_start(LOOPBACK, port, advertised_port=advertised_port)
    procs.track(proc)
    return Broker(host=LOOPBACK, port=real_port, pid=proc.pid, proc=proc)


@functools.cache
def tansu_version() -> str:
    """The version the Tansu binary reports (`tansu --version`), e.g. "0.6.0"."""
    done = subprocess.run(
        [str(tansu_path()), "--version"], capture_output=True, text=True, timeout=10, check=True
    )
    found = re.search(r"\d+\.\d+\.\d+\S*", done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"tansu --version printed no version: {done.stdout!r}")
    return found.group(0)


TANSU_0_6_0 = tansu_version() == "0.6.0"
"""Whether the broker is Tansu 0.6.0: the condition of the strict xfails of its known bugs."""
