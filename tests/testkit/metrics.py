"""kipside's /metrics, read with prometheus_client's own parser (never by splitting lines).

    m = scrape(f"http://127.0.0.1:{admin_port}/metrics")
    m.value("kipside_client_requests_total", api="Produce")  # one number
    m.value("kipside_lane_failures_total", default=0.0)       # 0.0 if kipside has none yet

Samples are looked up by their exposed name (a counter's `_total` included) and a subset of
their labels; several matching samples add up (a counter over all its label values).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Metrics", "Sample", "metrics_url", "parse", "scrape"]

_MISSING = object()


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Metrics:
    """One scrape: every sample of every family."""

    samples: tuple[Sample, ...]

    def matching(self, name: str, **labels: str) -> list[Sample]:
        """Samples called `name` whose labels include `labels`."""
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, default: float | object = _MISSING, **labels: str) -> float:
        """The sum of the samples `matching(name, **labels)`; KeyError if there are none and
        no default was given (a metric that vanished must fail a test, not read as 0)."""
        found = self.matching(name, **labels)
        if found:
            return sum(s.value for s in found)
        if isinstance(default, float | int):
            return float(default)
        have = sorted({s.name for s in self.samples})
        raise KeyError(f"no sample {name}{labels or ''} in /metrics; it has: {', '.join(have)}")

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def parse(text: str) -> Metrics:
    """Parse Prometheus text exposition format."""
    return Metrics(tuple(_samples(text_string_to_metric_families(text))))


def _samples(families: Iterable[Metric]) -> Iterable[Sample]:
    for family in families:
        for s in family.samples:
            yield Sample(s.name, dict(s.labels), float(s.value))


def metrics_url(admin_port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{admin_port}/metrics"


def scrape(url_or_port: str | int, timeout: float = 5.0) -> Metrics:
    """GET /metrics (a URL, or kipside's admin port on loopback) and parse it."""
    url = metrics_url(url_or_port) if isinstance(url_or_port, int) else url_or_port
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse(response.read().decode())
