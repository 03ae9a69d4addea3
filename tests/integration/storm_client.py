"""A connection storm in its own process (so the test process, where the latency probe runs,
pays none of its CPU), for test_faults_storm.py and bench/faults.py.

usage: python storm_client.py HOST:PORT CONNECTIONS SLOW_READERS TOPIC FETCHES FETCH_BYTES

First SLOW_READERS connections that each pipeline FETCHES Fetch requests (v4, FETCH_BYTES from
offset 0 of TOPIC's partition 0) and never read an answer; then CONNECTIONS non-blocking
connects at once, each sending an ApiVersions and a Metadata (all topics) request when
connected, never reading either. Prints `STORMED <seconds to connect them all>` and holds every
connection open until its stdin closes (or 120 s pass), then closes them all.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import sys
import time

from kipside.protocol import (
    ApiKey,
    FetchPartition,
    build_frame,
    encode_fetch_request,
    encode_request_header,
)

SELF_TIMEOUT = 120.0


def request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    return build_frame(encode_request_header(api_key, version, correlation_id, "storm"), body)


def slow_reader(address: tuple[str, int], topic: str, fetches: int, size: int) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    body = encode_fetch_request(
        4,
        [FetchPartition(topic, 0, 0, size)],
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=size,
        isolation_level=0,
    )
    sock.setblocking(False)
    for correlation_id in range(fetches):
        try:  # what kipside no longer reads stays unsent: it did not ask for more
            sock.send(
                build_frame(encode_request_header(ApiKey.FETCH, 4, correlation_id, "slow"), body)
            )
        except BlockingIOError:
            break
    return sock


def storm(address: tuple[str, int], count: int) -> list[socket.socket]:
    selector = selectors.DefaultSelector()
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        selector.register(sock, selectors.EVENT_WRITE)
        socks.append(sock)
    payload = request(ApiKey.API_VERSIONS, 0, 1) + request(
        ApiKey.METADATA, 1, 2, (-1).to_bytes(4, "big", signed=True)
    )
    waiting, deadline = count, time.monotonic() + 60
    while waiting:
        if time.monotonic() > deadline:
            raise SystemExit(f"{waiting} of {count} connections never connected")
        for key, _ in selector.select(1.0):
            made = key.fileobj
            assert isinstance(made, socket.socket)
            selector.unregister(made)
            waiting -= 1
            error = made.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise SystemExit(f"a connection failed: {os.strerror(error)}")
            made.send(payload)  # 50-odd bytes: the kernel takes them whole
    selector.close()
    return socks


def main() -> None:
    target, connections, slow, topic, fetches, size = sys.argv[1:7]
    host, port = target.rsplit(":", 1)
    address = (host, int(port))
    started = time.monotonic()
    held = [slow_reader(address, topic, int(fetches), int(size)) for _ in range(int(slow))]
    held += storm(address, int(connections))
    print(f"STORMED {time.monotonic() - started:.3f}", flush=True)
    deadline = time.monotonic() + SELF_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
    for sock in held:
        sock.close()


if __name__ == "__main__":
    main()
