"""Rule hot reload: SIGHUP, a changed rule file, or POST /rules/reload put new rules in force.

A reload reads and validates the whole file before anything changes. A file with any problem
is rejected in full: its FILE:LINE problems are logged and counted, and the rules in force stay.
A valid file applies to requests that start after it. No connection is dropped, and no client's
ProduceRequests are reordered when a reload moves them between the shared lanes and the
client's own broker connection (stages.coalescing.order keeps every route change in order,
a reload's among them). What cannot change while running: a node's lane
pool keeps the lane count it was created with (brokers first used after the reload get the new
`coalescing.lanes`), and a client keeps the ApiVersions features it was told when it connected.

This module must never raise into the proxy (a reload either applies or is a logged, counted
RuleError) and never block it: the file is read in a worker thread.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Final, Literal, Protocol

import trio

from kipside.proxy.stages.versions import VersionPolicy
from kipside.rules import (
    DEFAULT_SOURCE,
    FILE_KEY,
    RuleError,
    RuleProblem,
    RuleSet,
    load_rules,
)

log = logging.getLogger("kipside.rules")

POLL_SECONDS: Final = 1.0

Outcome = Literal["applied", "unchanged", "rejected", "no-file"]


@dataclass(frozen=True, slots=True)
class ReloadResult:
    outcome: Outcome
    version: str
    """The version in force after the attempt (the old one unless `applied`)."""
    previous_version: str
    source: str
    problems: tuple[str, ...] = ()
    """FILE:LINE: KEY: MESSAGE lines of a rejected file."""

    @property
    def ok(self) -> bool:
        return self.outcome in ("applied", "unchanged")

    def describe(self) -> dict[str, object]:
        """The result as JSON-ready data: ok, then the fields in order."""
        return {"ok": self.ok, **asdict(self), "problems": list(self.problems)}


class _Sharing(Protocol):
    @property
    def share_connections(self) -> bool: ...


class RuleHolder(Protocol):
    """What a reload reads and changes: the server (kipside.proxy.server.Server) as it sees it.

    The server builds the reloader, so the reloader knows the server only through this.
    """

    rules: RuleSet
    """The rules in force: sessions, new lane pools and every feature read them from here."""

    @property
    def config(self) -> _Sharing: ...

    @property
    def versions(self) -> VersionPolicy: ...


FileStamp = tuple[int, int, int, int]


def file_stamp(path: str) -> FileStamp | None:
    """What changes when a file is rewritten or replaced (also through a symlink swap, as
    Kubernetes does with mounted ConfigMaps); None when the file is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def apply_rules(server: RuleHolder, new: RuleSet) -> None:
    """Put a validated rule set in force for every request that starts from now on."""
    old = server.rules
    server.rules = new
    server.versions.lower_transaction_version = (
        bool(new.transactions) and server.config.share_connections
    )
    if new.coalescing.lanes != old.coalescing.lanes:
        log.warning(
            "coalescing.lanes changed from %d to %d: brokers kipside already has lanes to keep "
            "%d until kipside restarts; lanes opened to other brokers from now on number %d",
            old.coalescing.lanes,
            new.coalescing.lanes,
            old.coalescing.lanes,
            new.coalescing.lanes,
        )
    if new.limits.max_frame_bytes != old.limits.max_frame_bytes:
        log.info(
            "limits.max_frame_bytes changed from %d to %d: applies to client connections and "
            "lane pools opened from now on",
            old.limits.max_frame_bytes,
            new.limits.max_frame_bytes,
        )
    if bool(new.transactions) != bool(old.transactions):
        log.info(
            "transaction rules %s: clients that connect from now on are offered "
            "transaction.version %s; connected clients keep what they were told",
            "added" if new.transactions else "removed",
            "at most 1" if server.versions.lower_transaction_version else "as the broker has it",
        )


class RuleReloader:
    """Reloads the server's rule file on demand, on SIGHUP and when the file changes."""

    def __init__(self, server: RuleHolder, *, poll_seconds: float = POLL_SECONDS) -> None:
        self.server = server
        source = server.rules.source
        self.path: str | None = None if source == DEFAULT_SOURCE else source
        self.poll_seconds = poll_seconds
        self.rule_reloads = 0
        """Reloads that read a valid file (applied, or unchanged content)."""
        self.rule_reload_errors = 0
        """Reloads rejected because the file was invalid or unreadable."""
        self.last_error: str | None = None
        """The problems of the last rejected reload, cleared by the next valid one."""
        self.loaded_at = time.time()
        """Wall-clock time the rules in force were loaded."""
        self.on_applied: list[Callable[[RuleSet, RuleSet], None]] = []
        """Called with (old, new) after a new rule set is in force, for features that cache
        something derived from the rules."""
        self.on_sighup: list[Callable[[], Awaitable[object]]] = []
        """Also run on SIGHUP, after the rule file: other files kipside reloads (TLS
        certificates). SIGHUP reaches one receiver only, and this reloader is it."""
        self._lock = trio.Lock()
        self._attempted: FileStamp | None = None
        """The file's stamp when it was last read, so the watcher does not read it again
        after a SIGHUP or POST already did."""

    async def reload(self, trigger: str, *, only_if_changed: bool = False) -> ReloadResult:
        """Read the rule file again and put it in force if it is valid.

        `trigger` names the cause in the log. With `only_if_changed` (the file watcher) a file
        whose content matches the rules in force is neither applied nor counted.
        """
        async with self._lock:
            old = self.server.rules
            if self.path is None:
                log.info(
                    "rule reload (%s): kipside was started without --rules FILE; "
                    "the built-in defaults stay in force",
                    trigger,
                )
                return ReloadResult("no-file", old.version, old.version, old.source)
            # abandon_on_cancel: a read hung on a network file system must not hold up the
            # admin request (or shutdown) that asked for it.
            self._attempted = await trio.to_thread.run_sync(
                file_stamp, self.path, abandon_on_cancel=True
            )
            try:
                new = await trio.to_thread.run_sync(load_rules, self.path, abandon_on_cancel=True)
            except RuleError as exc:
                return self._rejected(trigger, old, exc)
            except Exception as exc:  # a bug in the loader must not end the proxy
                log.exception("rule reload (%s): reading %s failed", trigger, self.path)
                problem = RuleProblem(self.path, 0, FILE_KEY, f"kipside could not load it: {exc!r}")
                return self._rejected(trigger, old, RuleError([problem]))
            if only_if_changed and new.version == old.version:
                return ReloadResult("unchanged", old.version, old.version, old.source)
            self.rule_reloads += 1
            self.last_error = None
            if new.version == old.version:
                log.info(
                    "rule reload (%s): %s is unchanged (version %s)",
                    trigger,
                    self.path,
                    new.version,
                )
                return ReloadResult("unchanged", old.version, old.version, old.source)
            apply_rules(self.server, new)
            self.loaded_at = time.time()
            for hook in self.on_applied:
                try:
                    hook(old, new)
                except Exception:
                    log.exception(
                        "rule reload (%s): a hook failed; the new rules are in force", trigger
                    )
            log.info(
                "rules reloaded (%s) from %s: version %s -> %s",
                trigger,
                self.path,
                old.version,
                new.version,
            )
            return ReloadResult("applied", new.version, old.version, new.source)

    def _rejected(self, trigger: str, old: RuleSet, exc: RuleError) -> ReloadResult:
        self.rule_reload_errors += 1
        self.last_error = str(exc)
        problems = tuple(str(problem) for problem in exc.problems)
        log.error(
            "rule reload (%s) rejected: %d problem(s) in %s; version %s stays in force. "
            "Fix the file and reload again (kipside rules check %s shows the same problems):",
            trigger,
            len(problems),
            self.path,
            old.version,
            self.path,
        )
        for problem in problems:
            log.error("  %s", problem)
        return ReloadResult("rejected", old.version, old.version, old.source, problems)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reload on SIGHUP and on file changes until cancelled.

        SIGHUP is always handled (its default action would end the process); started() is
        called once the handler is in place, so a SIGHUP after `kipside: ready` is safe.
        """
        if threading.current_thread() is not threading.main_thread():
            # Embedded (signals reach only the main thread): file changes and POST only.
            async with trio.open_nursery() as nursery:
                if self.path is not None:
                    nursery.start_soon(self._watch_file, self.path)
                task_status.started()
            return
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                if self.path is not None:
                    nursery.start_soon(self._watch_file, self.path)
                task_status.started()
                async for _ in signals:
                    await self.reload("SIGHUP")
                    for hook in self.on_sighup:
                        await hook()

    async def _watch_file(self, path: str) -> None:
        """Poll the file's stamp; reload once a change has settled for one poll interval
        (an editor or a copy may still be writing when the first change shows)."""
        previous: FileStamp | None = None
        missing_logged = False
        while True:
            await trio.sleep(self.poll_seconds)
            stamp = await trio.to_thread.run_sync(file_stamp, path)
            if stamp is None:
                if not missing_logged:
                    log.warning(
                        "rule file %s is gone; version %s stays in force until it is back",
                        path,
                        self.server.rules.version,
                    )
                    missing_logged = True
                previous = None
                continue
            missing_logged = False
            if stamp != self._attempted and stamp == previous:
                await self.reload("file change", only_if_changed=True)
            previous = stamp
