"""Warnings from the Spark driver's source process to the terminal of the job that started it.

The source's planning (offset ranges, data loss) runs in a Python process that Spark's JVM
starts, whose output goes to Spark's log. What the user must see, such as offsets skipped
under failOnDataLoss=false, is appended to a notice file beside the checkpoint; the job reads
new lines as it waits and prints them above its progress line. Both ends are on the driver's
machine.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NoticeReader", "post_notice"]


def post_notice(path: str | None, text: str) -> None:
    """Append one notice (a single line) if the job asked for them."""
    if path is None:
        return
    line = " ".join(text.split()) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


class NoticeReader:
    """Reads the lines appended to a notice file since the last call."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.unlink(missing_ok=True)
        self._position = 0

    def new(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._position)
            data = f.read()
        complete = data.rfind(b"\n") + 1
        self._position += complete
        return [ln for ln in data[:complete].decode("utf-8", "replace").splitlines() if ln]

    def close(self) -> None:
        if self.path.exists():
            os.unlink(self.path)
