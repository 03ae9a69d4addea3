"""core.client_side.ClientSide in memory, as h11 tests its Connection: bytes in, requests out,
answers back in request order whichever route answers first, markers, and what the client
holds (core.limits). No socket, no trio: answers arrive when a test resolves them.
"""

from __future__ import annotations

import pytest
from test_session import heartbeat_request, produce_request

from kipside.protocol import ApiKey, FrameTooLargeError, NotKafkaError
from kipside.proxy.core.answers import Pending
from kipside.proxy.core.client_side import DRAINED, REFUSED, UPSTREAM_GONE, ClientSide, Slot
from kipside.proxy.core.limits import REQUEST_OVERHEAD_BYTES, ServerLimits
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import Limits


class Client:
    """A ClientSide under test, the times it said answers may be ready, and its server's count."""

    def __init__(self, max_frame_bytes: int = 1 << 20, **limits: int) -> None:
        self.stats = Stats()
        self.server = ServerLimits(lambda: Limits(**limits), self.stats)
        self.limits = self.server.client(lambda: "client test", 0.0)
        self.readies = 0
        self.side = ClientSide(self.limits, max_frame_bytes=max_frame_bytes, on_ready=self.ready)

    def ready(self) -> None:
        self.readies += 1

    def requests(self, data: bytes) -> list[tuple[int, int]]:
        """Feed bytes; (api key, correlation id) of every whole request in them."""
        self.side.receive_data(data)
        found = []
        while (frame := self.side.next_frame()) is not None:
            header = self.side.header(frame)
            found.append((header.api_key, header.correlation_id))
        return found

    def owe(self, correlation_id: int, pending: Pending | None = None) -> Pending:
        pending = pending or Pending()
        self.side.owe(Slot(ApiKey.HEARTBEAT, 0, correlation_id, pending, False, 0.0, None))
        return pending

    def taken(self) -> tuple[list[int], object]:
        ready, marker = self.side.ready()
        return [slot.correlation_id for slot in ready], marker


def test_requests_come_out_whole_whatever_the_reads_cut() -> None:
    client = Client()
    stream = heartbeat_request(1) + produce_request(9, 2, acks=1) + heartbeat_request(3)
    found = []
    for i in range(0, len(stream), 7):  # seven bytes per read
        found += client.requests(stream[i : i + 7])
    assert found == [(ApiKey.HEARTBEAT, 1), (ApiKey.PRODUCE, 2), (ApiKey.HEARTBEAT, 3)]
    assert client.side.buffered == 0
    assert client.side.client_id == "tests"


def test_answers_leave_in_request_order_whichever_comes_first() -> None:
    client = Client()
    first, second, third = client.owe(1), client.owe(2), client.owe(3)
    third.resolve(b"c")
    assert client.taken() == ([], None)  # held behind the first
    first.resolve(b"a")
    assert client.taken() == ([1], None)  # the second is not answered yet
    second.resolve(b"b")
    assert client.taken() == ([2, 3], None)
    assert client.readies == 3  # each arrival says the head may be ready


def test_a_failed_answer_is_given_back_in_its_place() -> None:
    client = Client()
    client.owe(1).fail("the broker went away")
    later = client.owe(2)
    later.resolve(b"x")
    ready, marker = client.side.ready()
    assert [s.correlation_id for s in ready] == [1, 2] and marker is None
    assert ready[0].pending.failure == "the broker went away"


@pytest.mark.parametrize("marker", [DRAINED, REFUSED, UPSTREAM_GONE])
def test_a_marker_stops_the_answers_after_those_owed_before_it(marker: object) -> None:
    client = Client()
    owed = client.owe(1)
    client.side.end(marker)  # type: ignore[arg-type]
    assert client.taken() == ([], None)
    owed.resolve(b"a")
    assert client.taken() == ([1], marker)


def test_forget_drops_every_answer_owed() -> None:
    client = Client()
    client.owe(1), client.owe(2)
    assert client.side.owed == 2
    assert [s.correlation_id for s in client.side.forget()] == [1, 2]
    assert client.side.owed == 0 and client.taken() == ([], None)


def test_what_the_client_holds_is_counted_until_written() -> None:
    client = Client(max_in_flight_bytes_per_client=2000)
    frame = heartbeat_request(1)
    held = client.limits.took(len(frame))
    assert held == len(frame) + REQUEST_OVERHEAD_BYTES
    pending = client.owe(1)
    pending.resolve(bytes(1600))  # a big answer came: held until written
    assert client.limits.held == held + 1600 == client.stats.in_flight_bytes
    assert client.limits.over() == "max_in_flight_bytes_per_client"
    client.limits.written(1.0, held, 1600)
    assert client.limits.held == 0 and client.limits.over() is None
    client.limits.close()
    assert client.stats.in_flight_bytes == 0


def test_a_frame_over_the_cap_and_a_foreign_protocol_are_refused() -> None:
    with pytest.raises(FrameTooLargeError):
        Client(max_frame_bytes=64).requests((1000).to_bytes(4, "big") + b"\x00" * 8)
    with pytest.raises(NotKafkaError, match="HTTP"):
        Client().requests(b"GET / HTTP/1.1\r\n\r\n")


def test_a_raw_token_is_a_frame_with_no_header() -> None:
    client = Client()
    client.side.receive_data(b"\x00\x00\x00\x03abc" + heartbeat_request(4))
    assert client.side.next_frame(raw_token_due=True) == b"\x00\x00\x00\x03abc"
    assert client.requests(b"") == [(ApiKey.HEARTBEAT, 4)]
