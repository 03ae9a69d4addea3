"""What `kipside serve` says when --upstream does not lead to a plaintext Kafka listener:
nothing listens there, a web server answers, or the listener speaks TLS. Each is one line that
names the address and what to change, and exit status 2 (the real command, as a user runs it,
against loopback servers started here).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import trustme
from testkit.kipside import KIPSIDE_BIN
from testkit.ports import LOOPBACK, free_port

Handler = Callable[[socket.socket], None]


@contextmanager
def server(handle: Handler) -> Iterator[int]:
    """A loopback server running `handle` on each connection; yields its port."""
    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                handle(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        listener.close()


def http_answer(conn: socket.socket) -> None:
    """A web server's answer to bytes that are no HTTP request."""
    conn.recv(1024)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def tls_listener(certificate: Path) -> Handler:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate)

    def handle(conn: socket.socket) -> None:
        # On plaintext, OpenSSL's server side closes without an alert, as Java's does.
        with suppress(OSError):  # ssl.SSLError is one
            context.wrap_socket(conn, server_side=True).close()

    return handle


def serve(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(KIPSIDE_BIN),
            "serve",
            "--upstream",
            f"{LOOPBACK}:{port}",
            "--listen",
            f"{LOOPBACK}:0",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("kipside: error: ")]
    return line


def test_nothing_listening_says_refused() -> None:
    port = free_port()
    line = error_line(serve(port, "--discovery-timeout", "1"))
    assert f"connection to {LOOPBACK}:{port} refused: nothing listens there" in line
    assert "no upstream broker answered within 1 s" in line
    assert "--discovery-timeout waits longer" in line


def test_a_web_server_is_named_as_http() -> None:
    with server(http_answer) as port:
        result = serve(port)  # no waiting out the discovery timeout: HTTP won't turn into Kafka
    line = error_line(result)
    assert f"{LOOPBACK}:{port}: received an HTTP response ('HTTP/1.1 400 Bad Request')" in line
    assert "--upstream must name the brokers' Kafka listeners" in line
    assert "frame size" not in line and "max_frame_bytes" not in line


def test_a_tls_listener_is_named_as_tls(tmp_path: Path) -> None:
    certificate = tmp_path / "broker.pem"
    trustme.CA().issue_cert("localhost", LOOPBACK).private_key_and_cert_chain_pem.write_to_path(
        str(certificate)
    )
    with server(tls_listener(certificate)) as port:
        result = serve(port)
    line = error_line(result)
    assert f"{LOOPBACK}:{port}: closed the connection at a plaintext Kafka request" in line
    assert (
        "answers a TLS handshake; its listener uses TLS: start kipside with --upstream-ca" in line
    )


@pytest.mark.parametrize("first", [b"\x15\x03\x03\x00\x02\x02\x46", b"SSH-2.0-OpenSSH_9.2\r\n"])
def test_other_protocols_are_named(first: bytes) -> None:
    def answer(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(first)

    with server(answer) as port:
        line = error_line(serve(port))
    assert "no upstream broker speaks plaintext Kafka" in line
    assert ("a TLS alert" if first[0] == 0x15 else "an SSH banner") in line
