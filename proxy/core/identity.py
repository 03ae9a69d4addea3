"""Who a client connection is: the principal every shared upstream connection belongs to.

A principal is named as Apache Kafka names it (``User:alice``; ``User:CN=app,O=acme`` for a
TLS client certificate; ``User:ANONYMOUS`` for a plaintext client nobody authenticated). kipside
shares upstream connections (lanes), coalesced requests and transaction registrations only
among connections of the same principal: two principals never share an upstream connection or a
request, so the broker always sees each client under its own identity and kipside can never
widen what the broker allows. This module holds only the value; it never authenticates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Principal:
    """A Kafka principal, ``User:NAME``, and how kipside learned it."""

    name: str
    """The principal as Kafka writes it, e.g. ``User:alice``."""
    source: str = "none"
    """How it was established: "none" (nobody authenticated), "tls" (a client certificate) or
    "sasl" (kipside authenticated the client with SASL)."""

    def __str__(self) -> str:
        return self.name


ANONYMOUS: Final = Principal("User:ANONYMOUS")
"""A client that did not authenticate to kipside (plaintext, or TLS without a certificate)."""
