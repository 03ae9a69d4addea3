"""Loopback ports: pick a free one, wait until something listens on one, a connected pair.

Built on kipside.proxy.devbroker (the product's own loop for `kipside dev`); this module adds
only the check that the process expected to listen is still alive, so a crash fails at once
with its exit code instead of after the whole timeout.
"""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

from kipside.proxy.devbroker import DevBrokerError, free_port
from kipside.proxy.devbroker import wait_for_port as _wait_once

__all__ = ["LOOPBACK", "PortNotListening", "free_port", "loopback_pair", "wait_for_port"]

LOOPBACK = "127.0.0.1"
_SLICE = 0.2  # how often the process is checked while its port is not yet open


class PortNotListening(RuntimeError):
    """Nothing listened on the port in time, or the process meant to listen exited."""


def wait_for_port(
    port: int,
    host: str = LOOPBACK,
    *,
    timeout: float = 10.0,
    process: subprocess.Popen[Any] | None = None,
    name: str = "the process",
) -> None:
    """Return once host:port accepts a connection; raise PortNotListening after `timeout` s,
    or as soon as `process` (the one that should listen there) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise PortNotListening(
                f"{name} exited with code {process.returncode} before listening on {host}:{port}"
            )
        try:
            _wait_once(host, port, timeout=min(_SLICE, max(0.0, deadline - time.monotonic())))
            return
        except DevBrokerError:
            if time.monotonic() >= deadline:
                raise PortNotListening(
                    f"nothing is listening on {host}:{port} after {timeout} s ({name})"
                ) from None


def loopback_pair(buffer_bytes: int) -> tuple[socket.socket, socket.socket]:
    """A connected pair of loopback TCP sockets, (the connecting end, the accepted end), each
    with kernel send and receive buffers of `buffer_bytes`: small ones let a test fill them
    (a backlog forms after a few hundred KiB)."""
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(1)
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    listener.close()
    for sock in (near, far):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
    return near, far
