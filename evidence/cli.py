"""`kipside pcap summary` and `kipside pcap compare`: registered on the `kipside` command line
through the `kipside.commands` entry point group, as the pipelines register theirs.

This module parses arguments, shows progress on a terminal and turns a capture the reader cannot
use into one line naming the file and the fix (exit status 2), as it does when scapy (kipside's
`pcap` extra) is not installed. It must stay cheap to import: the `kipside` command loads it to
build its parser, so scapy is imported only when a capture is read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

__all__ = ["register_pcap"]

_EPILOG = """\
examples, with kipside serving on 127.0.0.1:9092 in front of brokers on port 19092:
  # clients -> kipside: the bootstrap port and every node listener (node N on 9093+N by default)
  tcpdump -i lo -s 0 -U -w client.pcap 'tcp portrange 9092-9999'
  # kipside -> brokers
  tcpdump -i lo -s 0 -U -w broker.pcap 'tcp port 19092'
  kipside pcap summary client.pcap
  kipside pcap compare client.pcap broker.pcap

Captures are read in bounded memory, pcap or pcapng, gzipped or not. What a capture lacks
(lost or cut segments, a start mid-connection) is counted and reported, never fatal.
See docs/evidence.md.
"""


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1-65535")
    return port


def _ports_option(parser: argparse.ArgumentParser, flag: str, whose: str) -> None:
    parser.add_argument(
        flag,
        dest=flag.lstrip("-").replace("-", "_"),
        type=_port,
        nargs="+",
        action="extend",
        default=[],
        metavar="N",
        help=f"TCP port(s) of the Kafka servers in {whose} (brokers, or kipside); "
        "default: every TCP connection, the side that sent SYN being the client",
    )


def register_pcap(sub: Any) -> None:
    parser = sub.add_parser(
        "pcap",
        help="summarise packet captures of Kafka traffic; compare both sides of kipside",
        description="Read packet captures of Kafka traffic (tcpdump, tshark) and say what "
        "they show, independently of kipside's own metrics.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pcap = parser.add_subparsers(dest="pcap_command", required=True)
    summary = pcap.add_parser(
        "summary",
        help="requests per API, Produce batches, transactions, latency, connections",
        description="Summarise the Kafka traffic in one capture.",
    )
    summary.add_argument("file", help="a pcap or pcapng capture")
    _ports_option(summary, "--port", "the capture")
    summary.add_argument("--json", action="store_true", help="print the figures as JSON")
    summary.set_defaults(handler=_summary)
    compare = pcap.add_parser(
        "compare",
        help="the figures of both sides of kipside side by side, with the savings",
        description="Compare a capture taken between the clients and kipside with one taken "
        "between kipside and the brokers: the same figures side by side, and what kipside "
        "saved (requests, coordinator round trips, connections).",
    )
    compare.add_argument("client_side", help="capture of clients <-> kipside")
    compare.add_argument("broker_side", help="capture of kipside <-> brokers")
    _ports_option(compare, "--client-port", "the client-side capture (kipside's ports)")
    _ports_option(compare, "--broker-port", "the broker-side capture")
    compare.add_argument("--json", action="store_true", help="print the figures as JSON")
    compare.set_defaults(handler=_compare)


class _Progress:
    """A progress line on a terminal's stderr, at most four times a second; nothing otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = time.monotonic()
        self._shown = 0.0
        self.used = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._shown < 0.25 and done < total:
            return
        self._shown = now
        self.used = True
        rate = done / max(now - self._started, 1e-9) / 1e6
        share = f"{done / total:.0%}" if total else "?"
        self._stream.write(
            f"\rkipside pcap: {share} ({done / 1e6:,.0f} of {total / 1e6:,.0f} MB, "
            f"{rate:,.0f} MB/s)\x1b[K"
        )
        self._stream.flush()

    def clear(self) -> None:
        if self.used:
            self._stream.write("\r\x1b[K")
            self._stream.flush()


def _scapy_missing() -> str | None:
    """Why `kipside pcap` can't run here, if the `pcap` extra (scapy) is not installed."""
    try:
        import scapy  # noqa: F401
    except ImportError:
        return (
            "scapy is not installed: kipside pcap needs kipside's pcap extra "
            "(pip install 'kipside[pcap]')"
        )
    return None


def _run(args: argparse.Namespace, work: Any) -> int:
    problem = _scapy_missing()
    if problem is not None:
        print(f"kipside pcap: error: {problem}", file=sys.stderr)
        return 2
    from kipside.evidence.capture import CaptureError

    progress = _Progress(sys.stderr) if sys.stderr.isatty() else None
    try:
        text = work(progress)
    except CaptureError as exc:
        if progress is not None:
            progress.clear()
        print(f"kipside: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if progress is not None:
            progress.clear()
        return 130
    if progress is not None:
        progress.clear()
    print(text)
    return 0


def _summary(args: argparse.Namespace) -> int:
    def work(progress: Any) -> str:
        from kipside.evidence.analyse import summarize
        from kipside.evidence.report import format_summary

        summary = summarize(args.file, args.port, progress)
        return json.dumps(summary.as_dict(), indent=2) if args.json else format_summary(summary)

    return _run(args, work)


def _compare(args: argparse.Namespace) -> int:
    def work(progress: Any) -> str:
        from kipside.evidence.compare import compare
        from kipside.evidence.report import format_comparison

        comparison = compare(
            args.client_side,
            args.broker_side,
            client_ports=args.client_port,
            broker_ports=args.broker_port,
            progress=progress,
        )
        if args.json:
            return json.dumps(comparison.as_dict(), indent=2)
        return format_comparison(comparison)

    return _run(args, work)
