"""External programs the tests and benchmarks use but pip cannot install (Debian packages).

A missing one is never a FileNotFoundError: tests skip with `require()` naming the tool and how
to install it; benchmarks get a ToolMissing error that says the same.
"""

from __future__ import annotations

import ctypes.util
import shutil
from typing import NoReturn

__all__ = ["INSTALL", "ToolMissing", "find", "require", "require_library"]

INSTALL: dict[str, str] = {
    "kcat": "`make system-deps` (apt-get install kcat)",
    "haproxy": "`make system-deps` (apt-get install haproxy)",
    "java": "`make system-deps` (apt-get install openjdk-17-jre-headless)",
    "chromium": "`make system-deps` (apt-get install chromium)",
    "tshark": "`make system-deps` (apt-get install tshark)",
    "tcpdump": "`make system-deps` (apt-get install tcpdump)",
    "curl": "`apt-get install -y curl`",
    "libpcap": "`make system-deps` (apt-get install libpcap0.8)",
}


class ToolMissing(RuntimeError):
    """An external program is not on PATH."""


def _message(name: str, why: str) -> str:
    how = INSTALL.get(name, f"install {name}")
    return f"{name} is not installed ({why}): {how}"


def find(name: str, why: str = "needed here") -> str:
    """The path of program `name`; ToolMissing (naming how to install it) when it is absent."""
    path = shutil.which(name)
    if path is None:
        raise ToolMissing(_message(name, why))
    return path


def require(name: str, why: str = "needed by this test") -> str:
    """In a test: the path of program `name`, or skip the test naming the tool and its install."""
    try:
        return find(name, why)
    except ToolMissing as exc:
        _skip(str(exc))


def require_library(name: str, why: str = "needed by this test") -> str:
    """In a test: the shared library lib`name` (e.g. "pcap"), or skip naming how to install it."""
    found = ctypes.util.find_library(name)
    if found is None:
        _skip(_message(f"lib{name}", why))
    return found


def _skip(reason: str) -> NoReturn:
    import pytest

    pytest.skip(reason)
