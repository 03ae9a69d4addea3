"""CPU seconds (user + system) of a process tree and of this process, for the benchmarks'
accounting and the tests that compare CPU. Read with psutil; a process that is gone counts 0."""

from __future__ import annotations

import contextlib
import resource

import psutil


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid`, of the children it has reaped, and of its live descendants.

    0.0 when the process is gone. A descendant that exits without being reaped by its parent
    is counted only while alive (sample it with TreeSampler for such trees, e.g. Spark's).
    """
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            t = proc.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            descendants = proc.children(recursive=True)
    except psutil.Error:
        return 0.0
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            ct = child.cpu_times()
            total += ct.user + ct.system
    return float(total)


class TreeSampler:
    """Remembers the last CPU seconds seen of every process in a tree, one pid counted once:
    a lower bound (within one sample) of a tree whose processes are never reaped by it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, float] = {}

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    self.seen[proc.pid] = t.user + t.system

    def total(self) -> float:
        return float(sum(self.seen.values()))


def own_cpu_seconds(*, children: bool = True) -> float:
    """CPU seconds of this process, plus (by default) of the children it has reaped."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    total = me.ru_utime + me.ru_stime
    if children:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += kids.ru_utime + kids.ru_stime
    return total
