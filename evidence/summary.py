"""The figures of one capture (Summary), and the listener that adds them up as connections speak.

A Summary is plain data, the same for the terminal and for `--json`: requests per API with
their latency (p50, p99) and the errors their answers carried, Produce's requests, partitions,
batches, records and bytes, transactions and their coordinator round trips, the
CONCURRENT_TRANSACTIONS answers, connections per broker, and everything the capture made it
skip, counted by reason. Latency is the time from the packet that completed a request to the
packet that completed its answer, as seen where the capture was taken.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kipside.protocol import ApiKey, ErrorCode, api_name, error_name

from .connection import KAFKA, NOT_KAFKA, TLS, Connection, Endpoint
from .decode import RequestSeen, ResponseSeen
from .frames import Frame
from .latency import LatencyHistogram
from .transactions import TransactionFigures, TransactionTracker

__all__ = ["ApiFigures", "ProduceFigures", "Summary", "SummaryBuilder"]

CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)


@dataclass
class ApiFigures:
    requests: int = 0
    responses: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    """Answers carrying each error (by Kafka's name), each answer counted once per error."""
    versions: dict[str, int] = field(default_factory=dict)
    """Requests per API version ("v9": 12)."""


@dataclass
class ProduceFigures:
    requests: int = 0
    partitions: int = 0
    batches: int = 0
    records: int = 0
    batch_bytes: int = 0
    """Bytes of record batches (what the records take on the wire, headers included)."""
    acks0: int = 0
    """Requests with acks=0 (no answer expected)."""
    unread: int = 0
    """Requests whose body was not read (bytes lost in the capture, or it did not decode)."""
    corrupt_batches: int = 0
    """Batches whose CRC-32C does not match their bytes (their records are not counted)."""
    partitions_by_version: dict[str, int] = field(default_factory=dict)
    """Partitions in the requests of each Produce version (other dissectors read only some)."""

    @property
    def batches_per_request(self) -> float | None:
        read = self.requests - self.unread
        return self.batches / read if read else None


@dataclass
class Summary:
    """What one capture shows. Plain data: `as_dict()` is the `--json` output."""

    file: str
    packets: int
    file_bytes: int
    seconds: float
    apis: dict[str, ApiFigures]
    """Per API, in API key order."""
    produce: ProduceFigures
    transactions: TransactionFigures
    concurrent_transactions: dict[str, int]
    """CONCURRENT_TRANSACTIONS answers per API."""
    connections: dict[str, int]
    """Kafka connections per broker (the server side of the capture: a broker, or kipside)."""
    skipped: dict[str, int]
    """Everything the capture made the summary skip or guess, by reason (see analyse.SKIPPED)."""
    other_connections: dict[str, int] = field(default_factory=dict)
    """Connections that were not Kafka: TLS, not Kafka."""

    @property
    def requests(self) -> int:
        return sum(api.requests for api in self.apis.values())

    def api(self, name: str) -> ApiFigures:
        return self.apis.get(name, ApiFigures())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["requests"] = self.requests
        out["produce"]["batches_per_request"] = _rounded(self.produce.batches_per_request)
        out["transactions"]["round_trips_per_transaction"] = _rounded(
            self.transactions.round_trips_per_transaction
        )
        return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class _Api:
    __slots__ = ("errors", "latency", "requests", "responses", "versions")

    def __init__(self) -> None:
        self.requests = 0
        self.responses = 0
        self.latency = LatencyHistogram()
        self.errors: Counter[int] = Counter()
        self.versions: dict[int, int] = {}


class SummaryBuilder:
    """Adds up what every connection of a capture says (a connection.Listener)."""

    def __init__(self, ports: frozenset[int] = frozenset()) -> None:
        self._ports = ports
        self._apis: dict[int, _Api] = {}
        self.produce = ProduceFigures()
        self._transactions = TransactionTracker()
        self._concurrent: Counter[int] = Counter()
        self._kafka: Counter[Endpoint] = Counter()
        self._empty: Counter[Endpoint] = Counter()
        self._other: Counter[str] = Counter()
        self._produce_partitions: dict[int, int] = {}  # by Produce version

    def request(self, connection: Connection, request: RequestSeen) -> None:
        api = self._apis.get(request.api_key)
        if api is None:
            api = self._apis[request.api_key] = _Api()
        api.requests += 1
        versions = api.versions
        versions[request.api_version] = versions.get(request.api_version, 0) + 1
        if request.api_key == ApiKey.PRODUCE:
            produce = self.produce
            produce.requests += 1
            if request.problem is not None or request.acks is None:
                produce.unread += 1
                return
            produce.partitions += request.partitions
            by_version = self._produce_partitions
            by_version[request.api_version] = by_version.get(request.api_version, 0) + (
                request.partitions
            )
            produce.batches += request.batches
            produce.records += request.records
            produce.batch_bytes += request.batch_bytes
            produce.corrupt_batches += request.corrupt_batches
            produce.acks0 += request.acks == 0
        else:
            self._transactions.request(request)

    def response(
        self, connection: Connection, request: RequestSeen, response: ResponseSeen, ts: float
    ) -> None:
        api = self._apis[request.api_key]
        api.responses += 1
        api.latency.add(max(0.0, ts - request.ts))
        for code in response.error_codes:
            if code:
                api.errors[code] += 1
        if CONCURRENT_TRANSACTIONS in response.error_codes:
            self._concurrent[request.api_key] += 1
        self._transactions.response(request, response)

    def frame(
        self, connection: Connection, frame: Frame, request: RequestSeen, is_response: bool
    ) -> None:
        pass  # keeps_frames is not set: never called

    def closed(self, connection: Connection) -> None:
        if connection.kind == KAFKA:
            self._kafka[connection.server] += 1
        elif connection.kind is None:
            self._empty[connection.server] += 1
        elif connection.kind in (TLS, NOT_KAFKA):
            self._other[connection.kind] += 1

    def summary(
        self, *, file: str, packets: int, file_bytes: int, seconds: float, skipped: dict[str, int]
    ) -> Summary:
        apis = {}
        for key in sorted(self._apis):
            api = self._apis[key]
            p50, p99 = api.latency.percentile(50), api.latency.percentile(99)
            apis[api_name(key)] = ApiFigures(
                api.requests,
                api.responses,
                None if math.isnan(p50) else round(p50 * 1000, 3),
                None if math.isnan(p99) else round(p99 * 1000, 3),
                {error_name(code): n for code, n in sorted(api.errors.items())},
                {f"v{version}": n for version, n in sorted(api.versions.items())},
            )
        # A connection that carried nothing is a Kafka connection if its server speaks Kafka.
        kafka_servers = set(self._kafka) | {s for s in self._empty if s.port in self._ports}
        connections: Counter[str] = Counter()
        for server, n in (self._kafka + self._empty).items():
            if server in kafka_servers:
                connections[str(server)] += n
        return Summary(
            file=file,
            packets=packets,
            file_bytes=file_bytes,
            seconds=round(seconds, 6),
            apis=apis,
            produce=dataclasses.replace(
                self.produce,
                partitions_by_version={
                    f"v{v}": n for v, n in sorted(self._produce_partitions.items())
                },
            ),
            transactions=self._transactions.figures(),
            concurrent_transactions={api_name(k): n for k, n in sorted(self._concurrent.items())},
            connections=dict(sorted(connections.items())),
            skipped=skipped,
            other_connections={
                "TLS": self._other[TLS],
                "not Kafka": self._other[NOT_KAFKA],
                "no data": sum(n for s, n in self._empty.items() if s not in kafka_servers),
            },
        )
