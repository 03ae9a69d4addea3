"""The live console of `kipside dev`: one line of figures kept at the bottom of a terminal.

Every second the line is redrawn in place (carriage return, the figures, clear to the end of the
line): client and upstream connections, requests per second over the admin endpoint's rate
window (the one status.json reports), Produce requests in from clients and out to brokers with
their ratio, and transaction-begin holds. Whatever else is printed meanwhile (the server's
notices, log records, spans) goes through the console's streams, which lift the live line, write
the text, and put the line back below it, so the two never interleave on one row.

It only reads the server's counters. It must never draw on anything but a terminal: the caller
decides with `is_terminal`, and without one `kipside dev` prints plain lines only.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, TextIO

import trio

from kipside.protocol import ApiKey
from kipside.proxy.operations.admin import RateWindow
from kipside.proxy.telemetry.stats import Stats

REFRESH_SECONDS: Final = 1.0
CLEAR_TO_END: Final = "\x1b[K"


def is_terminal(stream: TextIO) -> bool:
    """True when a live line can be drawn on `stream`: a terminal that understands ANSI."""
    return stream.isatty() and os.environ.get("TERM", "") != "dumb"


@dataclass(frozen=True, slots=True)
class LiveFigures:
    client_connections: int
    upstream_connections: int
    requests_per_second: float | None
    """All client requests, per second over the rate window; None until it spans any time."""
    produce_in: int
    """ProduceRequests received from clients."""
    produce_out: int
    """ProduceRequests sent to brokers (one coalesced request counts once)."""
    holds: int

    @classmethod
    def read(cls, stats: Stats, window: RateWindow, now: float) -> LiveFigures:
        rates = window.rates(now, stats)
        return cls(
            client_connections=stats.client_connections,
            upstream_connections=stats.upstream_connections,
            requests_per_second=None if rates is None else sum(rates[1].values()),
            produce_in=stats.client_requests[ApiKey.PRODUCE],
            produce_out=stats.upstream_requests[ApiKey.PRODUCE],
            holds=stats.holds,
        )

    def line(self) -> str:
        rate = "-" if self.requests_per_second is None else f"{self.requests_per_second:.1f}"
        ratio = f"{self.produce_in / self.produce_out:.2f}x" if self.produce_out else "-"
        return (
            f"clients {self.client_connections} | upstream {self.upstream_connections} | "
            f"{rate} req/s | Produce {self.produce_in} in -> {self.produce_out} out "
            f"({ratio}) | holds {self.holds}"
        )


class LiveConsole:
    """A terminal with one live line at the bottom and ordinary lines scrolling above it."""

    def __init__(self, terminal: TextIO) -> None:
        self._terminal = terminal
        self._lock = threading.Lock()  # log records may come from the SDK's export thread
        self._line = ""

    def show(self, line: str) -> None:
        """Draw `line` in place of the current live line."""
        with self._lock:
            self._line = line[: self._width() - 1] if self._width() > 1 else line
            self._terminal.write("\r" + self._line + CLEAR_TO_END)
            self._terminal.flush()

    def write_above(self, stream: TextIO, text: str) -> None:
        """Write whole lines to `stream` (the same terminal) above the live line."""
        with self._lock:
            if self._line:
                self._terminal.write("\r" + CLEAR_TO_END)
                self._terminal.flush()
            stream.write(text)
            stream.flush()
            if self._line:
                self._terminal.write(self._line + CLEAR_TO_END)
                self._terminal.flush()

    def finish(self) -> None:
        """Leave the last live line on screen and move below it."""
        with self._lock:
            if self._line:
                self._terminal.write("\n")
                self._terminal.flush()
                self._line = ""

    async def run(self, stats: Stats) -> None:
        """Redraw the figures every second, until cancelled."""
        window = RateWindow()
        while True:
            now = trio.current_time()
            window.sample(now, stats)
            self.show(LiveFigures.read(stats, window, now).line())
            await trio.sleep(REFRESH_SECONDS)

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self._terminal.fileno()).columns
        except (OSError, ValueError):
            return 0  # unknown: draw the whole line


class _Above(io.TextIOBase):
    """A text stream whose whole lines go above the live line; a partial line waits for its
    newline (a live line redrawn after half a line would split it)."""

    def __init__(self, console: LiveConsole, stream: TextIO) -> None:
        super().__init__()
        self._console = console
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            self._console.write_above(self._stream, lines + "\n")
        return len(text)

    def close_pending(self) -> None:
        if self._pending:
            self._console.write_above(self._stream, self._pending + "\n")
            self._pending = ""

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


@contextmanager
def live_console(stdout: TextIO, stderr: TextIO) -> Iterator[LiveConsole]:
    """A LiveConsole on `stdout`, with sys.stdout, sys.stderr and the root logger's handlers
    on those streams writing above its line until the block ends."""
    console = LiveConsole(stdout)
    above = {id(stdout): _Above(console, stdout), id(stderr): _Above(console, stderr)}
    handlers = [
        (handler, handler.stream)
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in above
    ]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = above[id(stdout)], above[id(stderr)]
    for handler, stream in handlers:
        handler.setStream(above[id(stream)])
    try:
        yield console
    finally:
        sys.stdout, sys.stderr = saved
        for handler, stream in handlers:
            handler.setStream(stream)
        for stream in above.values():
            stream.close_pending()
        console.finish()
