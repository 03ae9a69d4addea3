"""Summaries and comparisons as text for a terminal: aligned tables and one line per figure.

The words are Kafka's (API names such as AddPartitionsToTxn, error names such as
CONCURRENT_TRANSACTIONS). Of what a capture made the summary skip, each count above zero is
printed with what it means (analyse.SKIPPED, from where each count is declared), and "nothing"
when all are zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from .analyse import SKIPPED
from .compare import Comparison
from .summary import Summary

__all__ = ["SKIPPED", "format_comparison", "format_summary"]


def _n(value: int) -> str:
    return f"{value:,}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows under a header, the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        rest = zip(row[1:], widths[1:], strict=True)
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in rest]
        out.append("  ".join(cells).rstrip())
    return out


def _connections(summary: Summary) -> str:
    total = sum(summary.connections.values())
    per = ", ".join(f"{n} to {server}" for server, n in summary.connections.items())
    line = f"{_n(total)} Kafka connection{'s' * (total != 1)}" + (f" ({per})" if per else "")
    other = [f"{n} {kind}" for kind, n in summary.other_connections.items() if n]
    return line + (f"; also {', '.join(other)}" if other else "")


def _produce(summary: Summary) -> str:
    p = summary.produce
    line = (
        f"{_n(p.requests)} requests, {_n(p.partitions)} partitions, {_n(p.batches)} batches"
        f" ({_ratio(p.batches_per_request)} per request), {_n(p.records)} records,"
        f" {_size(p.batch_bytes)} of record batches"
    )
    extra = [f"{_n(p.acks0)} with acks=0"] if p.acks0 else []
    extra += [f"{_n(p.unread)} not read"] if p.unread else []
    extra += [f"{_n(p.corrupt_batches)} batches with a bad CRC"] if p.corrupt_batches else []
    return line + (f" ({', '.join(extra)})" if extra else "")


def _transactions(summary: Summary) -> str:
    t = summary.transactions
    line = (
        f"{_n(t.ended)} ended ({_n(t.committed)} committed, {_n(t.aborted)} aborted), "
        f"{_ratio(t.round_trips_per_transaction)} coordinator round trips per transaction "
        f"({_n(t.round_trips)} in all)"
    )
    if t.open:
        line += f"; {_n(t.open)} still open ({_n(t.open_round_trips)} round trips)"
    return line


def _concurrent(summary: Summary) -> str:
    by_api = summary.concurrent_transactions
    total = sum(by_api.values())
    if not total:
        return "0"
    return f"{_n(total)} (" + ", ".join(f"{api} {_n(n)}" for api, n in by_api.items()) + ")"


def _skipped(summary: Summary) -> list[str]:
    counts = [(n, SKIPPED.get(key, key)) for key, n in summary.skipped.items() if n]
    if not counts:
        return ["skipped: nothing"]
    return ["skipped:"] + [f"  {_n(n)} {what}" for n, what in counts]


def format_summary(summary: Summary) -> str:
    lines = [
        f"capture: {summary.file}: {_n(summary.packets)} packets, {_size(summary.file_bytes)}, "
        f"{summary.seconds:.2f} s",
        f"connections: {_connections(summary)}",
        "",
    ]
    rows = [
        [
            name,
            _n(api.requests),
            _n(api.responses),
            _ms(api.p50_ms),
            _ms(api.p99_ms),
            ", ".join(f"{e} {_n(n)}" for e, n in api.errors.items()),
        ]
        for name, api in summary.apis.items()
    ]
    rows.append(["total", _n(summary.requests), "", "", "", ""])
    lines += _table(["API", "requests", "answered", "p50 ms", "p99 ms", "errors"], rows)
    lines += [
        "",
        f"Produce: {_produce(summary)}",
        f"transactions: {_transactions(summary)}",
        f"CONCURRENT_TRANSACTIONS answers: {_concurrent(summary)}",
        *_skipped(summary),
    ]
    return "\n".join(lines)


def _saved(client: int | float, broker: int | float) -> str:
    saved = client - broker
    if not client:
        return _n(int(saved)) if isinstance(saved, int) else f"{saved:.2f}"
    text = _n(saved) if isinstance(saved, int) else f"{saved:.2f}"
    return f"{text} ({saved / client:.0%})"


def format_comparison(comparison: Comparison) -> str:
    c, b = comparison.client, comparison.broker

    def row(label: str, client: int, broker: int) -> list[str]:
        return [label, _n(client), _n(broker), _saved(client, broker)]

    def ratio(label: str, client: float | None, broker: float | None) -> list[str]:
        saved = "" if client is None or broker is None else _saved(client, broker)
        return [label, _ratio(client), _ratio(broker), saved]

    rows = [row("requests", c.requests, b.requests)]
    busiest = sorted({*c.apis, *b.apis}, key=lambda n: (-c.api(n).requests - b.api(n).requests, n))
    for name in busiest:
        rows.append(row(f"  {name}", c.api(name).requests, b.api(name).requests))
    rows += [
        row("Produce partitions", c.produce.partitions, b.produce.partitions),
        row("Produce batches", c.produce.batches, b.produce.batches),
        ratio(
            "batches per Produce request",
            c.produce.batches_per_request,
            b.produce.batches_per_request,
        ),
        row("Produce record batch bytes", c.produce.batch_bytes, b.produce.batch_bytes),
        row("transactions ended", c.transactions.ended, b.transactions.ended),
        row("coordinator round trips", _round_trips_of(c), _round_trips_of(b)),
        ratio(
            "  per transaction",
            c.transactions.round_trips_per_transaction,
            b.transactions.round_trips_per_transaction,
        ),
        row(
            "CONCURRENT_TRANSACTIONS answers",
            sum(c.concurrent_transactions.values()),
            sum(b.concurrent_transactions.values()),
        ),
        row("connections", sum(c.connections.values()), sum(b.connections.values())),
    ]
    lines = [
        f"client side: {c.file}: {_n(c.packets)} packets, {_connections(c)}",
        f"broker side: {b.file}: {_n(b.packets)} packets, {_connections(b)}",
        "",
        *_table(["", "client side", "broker side", "saved"], rows),
        "",
        "Produce latency p50 / p99 ms: "
        f"client side {_ms(c.api('Produce').p50_ms)} / {_ms(c.api('Produce').p99_ms)}, "
        f"broker side {_ms(b.api('Produce').p50_ms)} / {_ms(b.api('Produce').p99_ms)}",
        "",
        f"savings: {_n(comparison.requests_avoided)} requests avoided "
        f"({_n(comparison.produce_requests_avoided)} of them Produce), "
        f"{_n(comparison.round_trips_avoided)} coordinator round trips avoided, "
        f"{_n(comparison.connections_avoided)} connections avoided",
    ]
    for label, summary in (("client side", c), ("broker side", b)):
        skipped = _skipped(summary)
        lines.append(f"{label} {skipped[0]}")
        lines += skipped[1:]
    return "\n".join(lines)


def _round_trips_of(summary: Summary) -> int:
    t = summary.transactions
    return t.round_trips + t.open_round_trips
