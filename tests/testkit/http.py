"""The HTTP side of the admin endpoint's tests: one h11 client exchange, curl's output read back.

Sans-I/O, like h11 itself: `Exchange` says which bytes to send and takes the bytes that come
back; the tests move them over a blocking socket or a trio stream. It must never open a
connection itself, so the in-process tests (trio) and the integration tests (sockets) share it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import h11

CHUNK_BYTES = 8192  # a body goes out in pieces of this size, as a client's upload would
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Request:
    """What an h11 client asks for (on the admin endpoint at 127.0.0.1:port)."""

    port: int
    method: str
    target: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False  # send the body with transfer-encoding: chunked


class Exchange:
    """One request and its answer on one h11 client connection."""

    def __init__(self, request: Request) -> None:
        self.conn = h11.Connection(h11.CLIENT)
        body = request.body
        hdrs = [("host", f"127.0.0.1:{request.port}"), *request.headers]
        if request.chunked:
            hdrs.append(("transfer-encoding", "chunked"))
        elif body or request.method == "POST":
            hdrs.append(("content-length", str(len(body))))
        head = h11.Request(method=request.method, target=request.target, headers=hdrs)
        data = self.conn.send(head) or b""
        for i in range(0, len(body), CHUNK_BYTES):
            data += self.conn.send(h11.Data(data=body[i : i + CHUNK_BYTES])) or b""
        self.request = data + (self.conn.send(h11.EndOfMessage()) or b"")
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()

    def receive(self, data: bytes) -> Answer | None:
        """Take bytes the server sent (b"" when it closed): the answer once it is whole."""
        self.conn.receive_data(data)
        while (event := self.conn.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.Response):
                self._status = event.status_code
                self._headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return Answer(self._status, self._headers, bytes(self._body))
        return None


def curl_answer(out: bytes) -> Answer | None:
    """The final answer in `curl -i` output (after any "100 Continue"), or None if none came."""
    finals = [m for m in _STATUS_LINE.finditer(out) if m.group(1) != b"100"]
    if not finals:
        return None
    head, _, body = out[finals[-1].start() :].partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode().lower()] = value.decode().strip()
    return Answer(int(finals[-1].group(1)), headers, body)


def status_of(raw: bytes) -> int:
    """The status code of a raw HTTP answer."""
    return int(raw.split(b" ", 2)[1])
