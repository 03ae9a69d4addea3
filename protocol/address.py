"""A broker's address (HOST:PORT), the value both shells dial and the proxy hands to clients.

A plain value: it never resolves a name or opens a socket.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Address"]


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(
        cls, text: str, *, what: str, default_port: int | None = None, any_port: bool = False
    ) -> Address:
        """HOST:PORT, or a ValueError that names `what` (an option or argument). A bare HOST
        takes `default_port` when one is given; `any_port` allows port 0 (a listener's "any
        free port")."""
        host, sep, port_text = text.strip().rpartition(":")
        if not sep and default_port is not None:
            host, port_text = text.strip(), str(default_port)
        host = host.strip("[]")
        if (not sep and default_port is None) or not host or not port_text:
            raise ValueError(f"{what}: {text!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"{what}: port {port_text!r} in {text!r} is not a number") from None
        lowest = 0 if any_port else 1
        if not lowest <= port <= 65535:
            raise ValueError(f"{what}: port {port} in {text!r} is outside {lowest}..65535")
        return cls(host, port)

    @classmethod
    def parse_list(cls, text: str, *, what: str) -> tuple[Address, ...]:
        """A comma-separated list of HOST:PORT (as bootstrap.servers); empty parts are skipped.
        Raises ValueError naming `what` for the first part that is not HOST:PORT."""
        return tuple(cls.parse(part, what=what) for part in text.split(",") if part.strip())
