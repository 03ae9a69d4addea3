"""Start the Tansu that a relay fronts: it must advertise the relay's address, not its own,
or clients would learn the broker's real port from Metadata and bypass the relay."""

from __future__ import annotations

import subprocess

from kipside.proxy.devbroker import free_port, tansu_path, wait_for_port

from .base import LOOPBACK


def start_tansu_advertising(advertised_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start an in-memory Tansu on a free loopback port that advertises 127.0.0.1:advertised_port
    (the relay's) as its address; returns the process and its real port once it listens."""
    port = free_port()
    args = [
        str(tansu_path()),
        "broker",
        "--listener-url",
        f"tcp://{LOOPBACK}:{port}",
        "--advertised-listener-url",
        f"tcp://{LOOPBACK}:{advertised_port}",
        "--storage-engine",
        "memory://tansu/",
        "--silent",
    ]
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(LOOPBACK, port)
    except Exception:
        proc.kill()
        proc.wait(timeout=5)
        raise
    return proc, port
