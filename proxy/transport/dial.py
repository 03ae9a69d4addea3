"""How a connection to a broker is made: the signature every dialler shares, and the plain one.

`Dial` is TCP, then TLS and a SASL login where configured (security.settings builds those);
`plain_dial` is TCP alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kipside.protocol import Address
from kipside.proxy.transport.wire import Wire

__all__ = ["Dial", "plain_dial"]

Dial = Callable[[Address], Awaitable[Wire]]
"""Raises OSError (or UpstreamFailed) when the broker can't be reached or refuses kipside."""


async def plain_dial(address: Address) -> Wire:
    """A plaintext TCP connection to `address` (trio's happy eyeballs)."""
    return await Wire.connect(address.host, address.port)
