"""`kipside pcap` on hand-made captures: connections that are not plain Kafka, captures that begin
mid-connection, and files or ports with no Kafka at all, each told apart and said so.

Every capture here is written by tests/captures/pcapkit.py from frames built with
kipside.protocol, so the test knows every byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from captures import pcapkit
from kipside.evidence import NoKafkaError, summarize
from kipside.protocol import ApiKey, build_frame, encode_request_header
from kipside.proxy.cli import main

CLIENT = ("10.0.0.1", 40000)
SERVER = ("10.0.0.2", 9092)


def metadata_exchange(correlation_id: int) -> tuple[bytes, bytes]:
    request = build_frame(
        encode_request_header(ApiKey.METADATA, 1, correlation_id, "kit"), b"\xff\xff\xff\xff"
    )
    # Metadata v1 response: no brokers, no controller (-1), no topics.
    body = b"\x00" * 4 + b"\xff" * 4 + b"\x00" * 4
    response = build_frame(correlation_id.to_bytes(4, "big"), body)
    return request, response


def write(tmp_path: Path, *connections: list[object], name: str = "c.pcap") -> Path:
    packets = [p for packets in connections for p in packets]
    return pcapkit.write_pcap(tmp_path / name, pcapkit.from_packets(packets))


def kafka_connection(count: int = 3, **where: object) -> list[object]:
    return pcapkit.conversation([metadata_exchange(n) for n in range(1, count + 1)], **where)  # type: ignore[arg-type]


def tls_connection() -> list[object]:
    hello = b"\x16\x03\x01\x00\x40" + b"\x01" + b"\x00\x00\x3c" + b"\x03\x03" + b"\x00" * 58
    server_hello = b"\x16\x03\x03\x00\x30" + b"\x02" + b"\x00" * 47
    return pcapkit.conversation([(hello, server_hello)], client=("10.0.0.3", 40001))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_connection_is_summarised_and_its_answers_timed(tmp_path: Path) -> None:
    summary = summarize(write(tmp_path, kafka_connection()))
    metadata = summary.api("Metadata")
    assert (metadata.requests, metadata.responses, metadata.versions) == (3, 3, {"v1": 3})
    # Each answer is two packets (100 us apart) after its request: the server's ACK between.
    assert metadata.p50_ms is not None and 0.199 <= metadata.p50_ms <= 0.201
    assert summary.connections == {"10.0.0.2:9092": 1}
    assert not any(summary.skipped.values())


@pytest.mark.parametrize("server_closes_first", [False, True])
def test_a_request_left_unanswered_when_the_client_closes_is_abandoned_not_lost(
    tmp_path: Path, server_closes_first: bool
) -> None:
    request, _ = metadata_exchange(2)
    packets = pcapkit.conversation(
        [metadata_exchange(1), (request, None)], server_closes_first=server_closes_first
    )
    skipped = summarize(write(tmp_path, packets)).skipped
    if server_closes_first:  # the server hung up on a request: its answer is missing
        assert (skipped["unanswered"], skipped["abandoned"]) == (1, 0)
    else:  # the client hung up before the answer came: nothing was lost
        assert (skipped["unanswered"], skipped["abandoned"]) == (0, 1)


def test_a_capture_that_begins_mid_connection_starts_at_the_next_frame(tmp_path: Path) -> None:
    exchanges = [metadata_exchange(n) for n in (1, 2, 3)]
    packets = pcapkit.conversation(exchanges, mss=12)
    # Drop the handshake and the first request's first segment: the capture begins inside it.
    summary = summarize(write(tmp_path, packets[4:]), ports=[9092])
    assert summary.api("Metadata").requests == 2
    assert summary.api("Metadata").responses == 2
    assert summary.skipped["midstream"] == 2  # both directions
    # Passed over: the rest of the first request, and its answer (no request waits for it).
    first_request, first_answer = exchanges[0]
    assert summary.skipped["frames_skipped_bytes"] == len(first_request) - 12 + len(first_answer)
    assert summary.skipped["unmatched_responses"] == 0


def test_tls_alone_is_reported_as_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, tls_connection())
    with pytest.raises(NoKafkaError, match="TLS: 1 connection carries TLS"):
        summarize(path)
    code, out, err = run(["pcap", "summary", str(path)], capsys)
    assert (code, out) == (2, "")
    assert "encrypted and cannot be read" in err and "Traceback" not in err


def test_tls_beside_kafka_is_counted_apart(tmp_path: Path) -> None:
    summary = summarize(write(tmp_path, tls_connection(), kafka_connection()))
    assert summary.other_connections["TLS"] == 1
    assert summary.requests == 3


def test_a_port_with_no_kafka_says_what_the_capture_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, kafka_connection())
    code, out, err = run(["pcap", "summary", str(path), "--port", "80"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"kipside: error: {path}: no Kafka traffic on port 80 (")
    assert "9092" in err and "pass --port" in err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no such file"),
        (b"", "not a pcap or pcapng capture (an empty file"),
        (b"GIF89a" + b"\x00" * 40, "not a pcap or pcapng capture (it starts with bytes 47 49"),
    ],
)
def test_a_file_that_is_no_capture_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, says: str
) -> None:
    path = tmp_path / "not.pcap"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(["pcap", "summary", str(path)], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"kipside: error: {path}: {says}"), err
    assert "tcpdump" in err and len(err.splitlines()) == 1


def test_a_directory_is_no_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["pcap", "summary", str(tmp_path)], capsys)
    assert code == 2 and "not a file" in err


def test_json_is_the_summary_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, kafka_connection())
    code, out, err = run(["pcap", "summary", str(path), "--json", "--port", "9092"], capsys)
    assert (code, err) == (0, "")  # no progress line: stderr is not a terminal
    figures = json.loads(out)
    assert figures["apis"]["Metadata"]["requests"] == 3
    assert figures["requests"] == 3


def test_a_port_option_takes_several_ports(tmp_path: Path) -> None:
    other = kafka_connection(2, server=("10.0.0.2", 9093), client=("10.0.0.1", 40002))
    path = write(tmp_path, kafka_connection(), other)
    assert summarize(path, ports=[9092]).requests == 3
    assert summarize(path, ports=[9092, 9093]).requests == 5
    assert summarize(path, ports=[9092]).skipped["other_port_segments"] > 0


def test_a_progress_line_goes_to_a_terminal_only(tmp_path: Path) -> None:
    import pty
    import subprocess

    path = write(tmp_path, kafka_connection())
    kipside = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kipside"
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [str(kipside), "pcap", "summary", str(path)],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=60,
            check=False,
        )
        os.close(follower)
        follower = -1
        err = os.read(leader, 65536).decode()
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert done.returncode == 0
    assert "kipside pcap: 100% (" in err  # then the line is cleared
    assert b"Metadata" in done.stdout


def test_without_scapy_it_names_the_extra_to_install(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(tmp_path, kafka_connection())
    # A fresh interpreter in which scapy cannot be imported, as where the pcap extra is missing.
    no_scapy = "import sys; sys.modules['scapy'] = None; from kipside.proxy.cli import main; "
    done = subprocess.run(
        [sys.executable, "-c", no_scapy + "sys.exit(main())", "pcap", "summary", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "kipside pcap: error: scapy is not installed: kipside pcap needs kipside's pcap extra "
        "(pip install 'kipside[pcap]')\n"
    )
