"""The answer to one request, before it comes: a broker's frame, kipside's own, or a failure.

`Pending` is a future without a loop: whoever is owed the answer registers a callback
(`on_done`), which runs in whatever resolves it, with no task switch. A driver that must wait
for it wraps the callback in its loop's own event (transport.waiting.answer_of).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Pending", "UpstreamFailed"]


class UpstreamFailed(Exception):
    """The upstream connection ended before this request was answered."""


class Pending:
    """The future answer to one request: a response frame or a failure reason."""

    __slots__ = ("_callbacks", "error_name", "failure", "frame")

    def __init__(self) -> None:
        self.frame: bytes | None = None
        self.failure: str | None = None
        self.error_name: str | None = None
        """The Kafka error in the answer, when whoever built it knows (for traces)."""
        self._callbacks: list[Callable[[], None]] | None = None

    @classmethod
    def answered(cls, frame: bytes) -> Pending:
        pending = cls()
        pending.frame = frame
        return pending

    def resolve(self, frame: bytes) -> None:
        if self.frame is None and self.failure is None:
            self.frame = frame
            self._fire()

    def fail(self, reason: str) -> None:
        if self.frame is None and self.failure is None:
            self.failure = reason
            self._fire()

    def _fire(self) -> None:
        callbacks = self._callbacks
        if callbacks is not None:
            self._callbacks = None
            for callback in callbacks:
                callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call callback once answered (at once if it already is)."""
        if self.frame is not None or self.failure is not None:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    @property
    def done(self) -> bool:
        return self.frame is not None or self.failure is not None

    def result(self) -> bytes:
        """The answer's frame; raises UpstreamFailed if it failed (call once done)."""
        if self.frame is None:
            raise UpstreamFailed(self.failure or "no response")
        return self.frame
