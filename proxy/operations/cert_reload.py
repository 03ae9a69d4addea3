"""TLS certificate hot reload: on SIGHUP, and when the certificate, key or client CA file changes,
new client connections get the certificate the files now hold.

The files are read and checked in a worker thread (a hung network file system must not stall
the proxy); a valid set is put in force at once, for connections accepted from then on. Open
connections keep the certificate they were accepted with, so none is dropped. Files that can't
be used (a half-written copy, a key that belongs to another certificate) are logged and the
certificate in force stays. Like the rule file's watcher, a change is acted on once it has
settled for one poll interval, so a certificate and key copied one after the other are read
together. This module never raises into the proxy.
"""

from __future__ import annotations

import logging

import trio

from kipside.proxy.operations.reload import POLL_SECONDS, FileStamp, file_stamp
from kipside.proxy.security.certificates import CertificateError, ListenerTls, listener_context

log = logging.getLogger("kipside.tls")

Stamps = tuple[FileStamp | None, ...]


class CertificateReloader:
    """Reloads the client listeners' certificate on demand, on SIGHUP and on file changes."""

    def __init__(self, tls: ListenerTls, *, poll_seconds: float = POLL_SECONDS) -> None:
        self.tls = tls
        self.poll_seconds = poll_seconds
        self._lock = trio.Lock()
        self._attempted: Stamps = self._stamps()
        """The files' stamps when they were last read."""

    def _stamps(self) -> Stamps:
        return tuple(file_stamp(path) for path in self.tls.paths)

    async def reload(self, trigger: str) -> bool:
        """Read the files again and put them in force if they are valid."""
        async with self._lock:
            self._attempted = await trio.to_thread.run_sync(self._stamps, abandon_on_cancel=True)
            try:
                context = await trio.to_thread.run_sync(
                    listener_context, self.tls.files, abandon_on_cancel=True
                )
            except CertificateError as exc:
                self.tls.rejected(exc, trigger)
                return False
            except Exception as exc:  # a bug here must not end the proxy
                log.exception("TLS certificate reload (%s) failed", trigger)
                self.tls.rejected(CertificateError(f"kipside could not load it: {exc!r}"), trigger)
                return False
            self.tls.use(context, trigger)
            return True

    async def on_sighup(self) -> None:
        await self.reload("SIGHUP")

    async def watch(self) -> None:
        """Poll the files' stamps until cancelled; reload once a change has settled."""
        previous: Stamps | None = None
        missing_logged = False
        while True:
            await trio.sleep(self.poll_seconds)
            stamps = await trio.to_thread.run_sync(self._stamps)
            if None in stamps:
                if not missing_logged:
                    gone = [p for p, s in zip(self.tls.paths, stamps, strict=True) if s is None]
                    log.warning(
                        "TLS file %s is gone; the certificate in force stays until it is back",
                        ", ".join(gone),
                    )
                    missing_logged = True
                previous = None
                continue
            missing_logged = False
            if stamps != self._attempted and stamps == previous:
                await self.reload("file change")
            previous = stamps
