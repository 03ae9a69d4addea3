"""What a session asks of the layers above it, as small Protocols: a shared route and an
ApiVersions policy.

The network layer carries bytes; the Kafka features (kipside.proxy.features) decide where a
request goes and how ApiVersions answers are rewritten. They plug into the session through these
types, so the network layer never imports a feature and the features never import the session:
a route sees a client connection only as a ``RoutedClient``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.trace import Span

from kipside.protocol import RequestHeader, ResponseHeader
from kipside.proxy.core.answers import Pending
from kipside.proxy.security.identity import Principal
from kipside.proxy.upstream.connection import UpstreamConnection


@dataclass(frozen=True, slots=True)
class Routed:
    """A request taken by a shared route."""

    pending: Pending | None  # None: the client expects no response (acks=0)
    raw: bool  # the answer is the broker's frame and still needs kipside's rewrites


class RoutedClient(Protocol):
    """A client connection as a shared route sees it (network.session.Session is the one)."""

    authenticated: bool
    """Set once the client speaks SASL: from then on everything uses its own connection."""

    @property
    def node_id(self) -> int | None:
        """The upstream node this client connected to (None: the bootstrap listener)."""

    @property
    def client_id(self) -> str | None: ...

    @property
    def principal(self) -> Principal:
        """Who the client is to kipside: it shares connections only with its own principal."""

    @property
    def current_span(self) -> Span | None:
        """The span of the request being routed (for a route to link or annotate)."""

    @property
    def dedicated(self) -> UpstreamConnection | None:
        """The client's own upstream connection, once it has one."""

    def describe(self) -> str: ...

    def disconnect(self, reason: str) -> None:
        """Close the client connection now, as a broker would on a lost connection."""


# A shared route takes (client, frame, header) and returns how the request was taken, or None
# if it does not take it (the session then forwards it on the client's own connection).
SharedRoute = Callable[[RoutedClient, bytes, RequestHeader], Awaitable[Routed | None]]


@dataclass(frozen=True, slots=True)
class Narrowed:
    """A request let through in part (the rule file's principals section refused some of its
    partitions): `frame` goes on in its place, with the same header, and `merge` turns the
    broker's answer to it into the answer the client is owed (the refused partitions' errors
    added, in the client's order). With `close`, the client connection is closed once `frame`
    (if any) is forwarded, as Apache Kafka closes an acks=0 producer's connection on an error;
    `close` says why."""

    frame: bytes | None
    merge: Callable[[bytes], bytes] | None = None
    close: str | None = None


# A request check takes (client, frame, header) and returns kipside's answer refusing the
# request (the rule file's principals section), the part of it that may go on (Narrowed), or
# None if all of it may go on.
RequestCheck = Callable[[RoutedClient, bytes, RequestHeader], bytes | Narrowed | None]


class ApiVersionsPolicy(Protocol):
    """What kipside advertises in ApiVersions (features.versions.VersionPolicy is the one)."""

    def unsupported_answer(self, header: RequestHeader) -> bytes | None:
        """The answer to an ApiVersions request newer than kipside handles, or None if the
        broker may answer it."""

    def rewrite_response(self, api_version: int, frame: bytes, header: ResponseHeader) -> bytes:
        """The broker's ApiVersions answer, cut to what kipside can serve."""
