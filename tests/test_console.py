"""`kipside dev`'s console without a process: the live line, lines written above it, and the
one-line spans of --trace-console, on in-memory streams and trio's virtual clock."""

from __future__ import annotations

import io
import logging
import re
import sys

import trio
import trio.testing
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from kipside.protocol import ApiKey
from kipside.proxy.console import CLEAR_TO_END, LiveConsole, LiveFigures, live_console
from kipside.proxy.operations.admin import RateWindow
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import TraceConfig, Tracer, event, finish, span_line
from kipside.rules import default_rules, parse_rules


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stats(produce_in: int, produce_out: int, fetches: int = 0) -> Stats:
    stats = Stats(client_connections=3, upstream_connections=2, holds=1)
    stats.client_requests[ApiKey.PRODUCE] = produce_in
    stats.client_requests[ApiKey.FETCH] = fetches
    stats.upstream_requests[ApiKey.PRODUCE] = produce_out
    return stats


def test_live_figures_read_the_stats_and_the_admin_rate_window() -> None:
    window = RateWindow()
    stats = _stats(0, 0)
    window.sample(10.0, stats)
    assert LiveFigures.read(stats, window, 10.0).line() == (
        "clients 3 | upstream 2 | - req/s | Produce 0 in -> 0 out (-) | holds 1"
    )
    stats = _stats(120, 40, fetches=30)
    window.sample(12.0, stats)
    # (120 + 30) requests over the 2 s since the oldest sample.
    assert LiveFigures.read(stats, window, 12.0).line() == (
        "clients 3 | upstream 2 | 75.0 req/s | Produce 120 in -> 40 out (3.00x) | holds 1"
    )


def test_lines_written_above_the_live_line_lift_it_and_put_it_back() -> None:
    terminal = Terminal()
    console = LiveConsole(terminal)
    console.write_above(terminal, "before the line\n")
    console.show("clients 1")
    console.write_above(terminal, "a log record\n")
    console.show("clients 2")
    console.finish()
    assert terminal.getvalue() == (
        "before the line\n"
        f"\rclients 1{CLEAR_TO_END}"
        f"\r{CLEAR_TO_END}a log record\nclients 1{CLEAR_TO_END}"
        f"\rclients 2{CLEAR_TO_END}\n"
    )


def test_live_console_takes_over_stdout_stderr_and_the_log_handler() -> None:
    out, err = Terminal(), Terminal()
    handler = logging.StreamHandler(err)
    root = logging.getLogger()
    root.addHandler(handler)
    saved = sys.stdout, sys.stderr
    try:
        with live_console(out, err) as console:
            console.show("live")
            print("half", end="")  # a partial line waits for its end
            assert "half" not in out.getvalue()
            print(" and the rest")
            logging.getLogger("kipside.test").warning("a warning")
            print("unfinished", end="")
        assert (sys.stdout, sys.stderr) == saved
        assert handler.stream is err
    finally:
        sys.stdout, sys.stderr = saved
        root.removeHandler(handler)
    assert out.getvalue() == (
        f"\rlive{CLEAR_TO_END}"
        f"\r{CLEAR_TO_END}half and the rest\nlive{CLEAR_TO_END}"
        f"\r{CLEAR_TO_END}live{CLEAR_TO_END}"  # lifted for the log record on stderr
        f"\r{CLEAR_TO_END}unfinished\nlive{CLEAR_TO_END}\n"
    )
    assert err.getvalue() == "a warning\n"


def test_the_live_line_is_redrawn_every_second() -> None:
    terminal = Terminal()
    console = LiveConsole(terminal)
    stats = _stats(0, 0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(console.run, stats)
            await trio.sleep(1.5)
            stats.client_requests[ApiKey.PRODUCE] = 8
            stats.upstream_requests[ApiKey.PRODUCE] = 2
            await trio.sleep(2)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    figures = r"\r[^\r]* \| ([\d.-]+ req/s \| Produce \d+ in -> \d+ out) [^\r]*"
    assert re.findall(figures + re.escape(CLEAR_TO_END), terminal.getvalue()) == [
        "- req/s | Produce 0 in -> 0 out",
        "0.0 req/s | Produce 0 in -> 0 out",
        "4.0 req/s | Produce 8 in -> 2 out",  # 8 requests over the 2 s window
        "2.7 req/s | Produce 8 in -> 2 out",
    ]


def test_trace_console_prints_each_span_as_one_line() -> None:
    out = io.StringIO()
    tracer = Tracer(
        TraceConfig("console"),
        default_rules().tracing,
        exporter=ConsoleSpanExporter(out=out, formatter=span_line),
    )
    request = tracer.request_span(
        ApiKey.PRODUCE, 9, "orders", "127.0.0.1:50000", ["orders"], correlation_id=7
    )
    upstream = tracer.upstream_span(
        ApiKey.PRODUCE, 111, 0, [request], {"kafka.batch_count": 1, "kafka.acks": -1}
    )
    finish(upstream)
    finish(request)
    failed = tracer.request_span(ApiKey.ADD_PARTITIONS_TO_TXN, 3, None, "127.0.0.1:50001")
    event(failed, "kipside.txn.hold.release", held_ms=12.5, outcome="timeout")
    finish(failed, "CONCURRENT_TRANSACTIONS")
    tracer.shutdown()
    lines = out.getvalue().splitlines()
    time = r"\d\d:\d\d:\d\d\.\d{3}"
    assert len(lines) == 3, lines
    assert re.fullmatch(
        rf"{time} upstream Produce [\d.]+ms node=111 lane=0 batches=1 acks=-1 links=1 ok",
        lines[0],
    ), lines[0]
    assert re.fullmatch(
        rf"{time} send orders Produce v9 [\d.]+ms client=orders from=127\.0\.0\.1:50000 "
        r"correlation=7 ok",
        lines[1],
    ), lines[1]
    assert re.fullmatch(
        rf"{time} AddPartitionsToTxn v3 [\d.]+ms from=127\.0\.0\.1:50001 "
        r"\[hold\.release held_ms=12\.5 outcome=timeout\] CONCURRENT_TRANSACTIONS",
        lines[2],
    ), lines[2]


def test_tracing_enabled_false_turns_spans_off_with_an_exporter() -> None:
    out = io.StringIO()
    rules = parse_rules("tracing:\n  enabled: false\n", "r.yaml")
    tracer = Tracer(TraceConfig("console"), rules.tracing, exporter=ConsoleSpanExporter(out=out))
    assert not tracer.active
    assert not tracer.enabled_for(ApiKey.PRODUCE)
    assert default_rules().tracing.enabled  # on by default: the exporter decides
