"""Loopback packet captures with tcpdump, and tshark's reading of them, for tests and benchmarks.

`Tcpdump(path, ports)` captures TCP traffic to and from those ports on lo, whole packets
(`-s 0`: loopback carries 64 KiB TSO/GSO segments, which a default snap length would cut), with
a kernel buffer big enough for bursts; it is ready when tcpdump says it listens, and `stop()`
reports what tcpdump counted, the kernel's drops included. `tshark_fields` runs tshark's own
Kafka dissector over a capture, an implementation nobody here wrote. A missing tool is a skip
(tests) or ToolMissing (scripts) naming how to install it, never a FileNotFoundError.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import procs, tools

__all__ = ["CaptureStats", "Tcpdump", "tshark_fields"]

READY_TIMEOUT = 10.0
STOP_TIMEOUT = 20.0
_COUNT = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)$", re.M)


@dataclass(frozen=True)
class CaptureStats:
    captured: int
    dropped: int
    """Packets the kernel dropped before tcpdump could read them (the capture lacks them)."""


class Tcpdump:
    """One tcpdump process writing a capture of the given TCP ports on lo to `path`."""

    def __init__(
        self,
        path: Path,
        ports: Iterable[int],
        *,
        interface: str = "lo",
        buffer_kib: int = 65536,
        snaplen: int = 0,
        in_test: bool = True,
    ) -> None:
        self.path = path
        self.ports = sorted(set(ports))
        if not self.ports:
            raise ValueError("a capture needs at least one port")
        why = "captures traffic on loopback"
        self._binary = tools.require("tcpdump", why) if in_test else tools.find("tcpdump", why)
        self._args = [
            self._binary,
            "-i",
            interface,
            "-s",
            str(snaplen),
            "-U",
            # Packets reach tcpdump as they come, not a ring block at a time: a block still
            # in the ring when SIGINT arrives would be lost.
            "--immediate-mode",
            "-B",
            str(buffer_kib),
            "-w",
            str(path),
        ]
        if os.geteuid() == 0:
            self._args += ["-Z", "root"]  # write where root can (no switch to user tcpdump)
        self._args.append(" or ".join(f"tcp port {port}" for port in self.ports))
        self._stderr = path.with_suffix(path.suffix + ".tcpdump.log")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Tcpdump:
        with self._stderr.open("wb") as err:
            self._proc = procs.track(
                subprocess.Popen(self._args, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while "listening on" not in self._stderr.read_text(errors="replace"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._proc.kill()
                raise RuntimeError(
                    f"tcpdump did not start capturing ({' '.join(self._args)}):\n"
                    + self._stderr.read_text(errors="replace")
                )
            time.sleep(0.02)
        return self

    def stop(self) -> CaptureStats:
        """Stop capturing (SIGINT, so tcpdump writes out what it holds); what it counted."""
        proc = self._proc
        assert proc is not None, "start() first"
        if proc.poll() is None:
            time.sleep(0.2)  # the last segments reach the packet socket
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
                raise RuntimeError(f"tcpdump did not stop within {STOP_TIMEOUT} s") from None
        text = self._stderr.read_text(errors="replace")
        counts = {what: int(n) for n, what in _COUNT.findall(text)}
        if "packets captured" not in text and "packet captured" not in text:
            raise RuntimeError(f"tcpdump exited with {proc.returncode}:\n{text}")
        return CaptureStats(counts.get("captured", 0), counts.get("dropped by kernel", 0))

    def __enter__(self) -> Tcpdump:
        return self.start()

    def __exit__(self, *_: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)


def tshark_fields(
    path: Path,
    ports: Iterable[int],
    fields: Sequence[str],
    *,
    display_filter: str | None = None,
    in_test: bool = True,
    timeout: float = 120.0,
) -> list[list[str]]:
    """tshark's Kafka dissector over a capture: one row per packet (that passes the filter),
    one cell per field, each cell every occurrence joined by ','."""
    why = "its Kafka dissector cross-checks kipside's"
    binary = tools.require("tshark", why) if in_test else tools.find("tshark", why)
    args = [binary, "-r", str(path)]
    for port in sorted(set(ports)):
        args += ["-d", f"tcp.port=={port},kafka"]
    if display_filter:
        args += ["-Y", display_filter]
    args += ["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"]
    for name in fields:
        args += ["-e", name]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tshark failed ({' '.join(args)}):\n{done.stderr[-2000:]}")
    return [line.split("\t") for line in done.stdout.splitlines()]
