"""Bad frames from a client and from a broker end only their own connection.

A raw socket client sends kipside each frame of the robustness kit (kipside.evidence.craft:
bad sizes, truncated headers, an unknown API key, bad tagged fields, huge arrays, negative
lengths) on a connection of its own; a relay playing a hostile broker corrupts the answers to
the requests of chosen clients. Meanwhile a confluent-kafka producer on its own connection
keeps producing. For each bad frame the test checks what Apache Kafka would do (a broker
closes a connection whose request it cannot read, waits for the rest of a frame cut short, and
answers what it can read), that kipside logged one line naming the client and what was wrong,
and at the end that the producer never saw an error and every record it sent is in the topic
exactly once, in order.

Run: .venv/bin/pytest tests/integration/test_bad_frames.py -q -p no:cacheprovider
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import confluent_kafka as ck
import pytest
from conftest import fresh_topic
from inprocess import StartKipside
from relaykit.base import Relay
from relaykit.decisions import Conn, Request
from relaykit.tansu import tansu_behind
from testkit.broker import Broker
from testkit.kipside import Kipside, start_kipside

from kipside.evidence.craft import (
    MALFORMED,
    bad_tagged_fields,
    huge_array,
    negative_length,
    truncated,
)
from kipside.evidence.craft import request as craft_request
from kipside.protocol import (
    ApiKey,
    build_frame,
    encode_request_header,
    encode_response_header,
)

from .clients import Msg, assert_exactly_once_in_order
from .clients_confluent import ck_config
from .clients_read_back import consume_assigned

pytestmark = pytest.mark.integration

PARTITIONS: Final = 2
WAIT: Final = 5.0  # for kipside to answer or close a bad connection
QUIET: Final = 0.5  # how long a connection waiting for the rest of a frame is watched
STEADY_ID: Final = "steady-producer"
HUGE_VARINT: Final = b"\xff\xff\xff\xff\x0f"  # 2**32-1: kio reserves 32 GiB for the array


# What kipside must do with each frame of the kit, as Apache Kafka would: refuse (close the
# connection, with one line naming the client and what was wrong) what it cannot read, wait
# for the rest of a frame cut short, and pass on what it reads as valid, for the broker to
# answer or refuse (a broker then closing the connection is logged by kipside as such).
REFUSED, WAITING, FORWARDED = "refused", "waiting", "forwarded"
CLIENT_FRAMES: Final = {
    # The size cuts the request short: the rest reads as garbage.
    "size-too-small": REFUSED,
    # The size promises bytes that never come.
    "size-too-large": WAITING,
    "size-negative": REFUSED,
    "truncated-header": WAITING,
    "truncated-body": WAITING,
    # An API kipside does not know may be a newer broker's: the broker decides.
    "unknown-api-key": FORWARDED,
    "tagged-fields-count": REFUSED,
    "tagged-fields-size": REFUSED,
    # Kafka reads tags in any order (only writers must sort them).
    "tagged-fields-order": FORWARDED,
    "tagged-fields-varint": REFUSED,
    "huge-topics-array": REFUSED,
    "huge-partitions-array": REFUSED,
    # Kafka reads a nullable string or bytes of any negative length as null.
    "negative-client-id": FORWARDED,
    "negative-transactional-id": FORWARDED,
    # A topic name is not nullable.
    "negative-topic-name": REFUSED,
    "negative-records": FORWARDED,
}


@dataclass
class SteadyProducer:
    """A confluent-kafka producer (idempotent, acks=all) sending one record every few ms from
    a thread until stopped; `sent` are the records in send order."""

    bootstrap: str
    topic: str
    sent: list[Msg] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyProducer:
        self._thread = threading.Thread(target=self._run, name=STEADY_ID, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = ck.Producer(
            ck_config(
                self.bootstrap,
                **{"client.id": STEADY_ID, "enable.idempotence": True, "linger.ms": 2},
            )
        )

        def delivered(err: ck.KafkaError | None, _msg: ck.Message) -> None:
            if err is not None:
                self.errors.append(str(err))

        i = 0
        while not self._stop.is_set():
            msg = Msg(i % PARTITIONS, f"k{i}".encode(), f"steady-{i:06d}".encode())
            producer.produce(
                self.topic, msg.value, msg.key, partition=msg.partition, on_delivery=delivered
            )
            self.sent.append(msg)
            producer.poll(0.003)
            i += 1
        left = producer.flush(30)
        if left:
            self.errors.append(f"{left} records undelivered after 30 s")

    def stop(self) -> list[Msg]:
        assert self._thread is not None
        self._stop.set()
        self._thread.join(40)
        assert not self._thread.is_alive(), "the steady producer did not finish"
        return self.sent

    def check(self) -> None:
        """No delivery error, and every record sent is in the topic once, in order."""
        sent = self.stop()
        assert not self.errors, self.errors[:3]
        assert len(sent) > 50, f"only {len(sent)} records sent: the producer was stalled"
        received, marks = consume_assigned(self.bootstrap, self.topic, PARTITIONS, len(sent))
        assert_exactly_once_in_order(sent, received, marks)
        in_log = sum(high - low for low, high in marks.values())
        print(
            f"steady producer: acknowledged {len(sent)}, found {len(received)} "
            f"({in_log} in the log), duplicates 0, reordered 0"
        )


def connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT)


def reaction(sock: socket.socket, frame: bytes, wait: float) -> str:
    """What came back for `frame` within `wait` s: "closed", "answered" or "nothing"."""
    sock.sendall(frame)
    sock.settimeout(wait)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return "nothing"
    except ConnectionResetError:
        return "closed"
    return "answered" if data else "closed"


def names_port(line: str, port: int) -> bool:
    return re.search(rf"127\.0\.0\.1:{port}\b", line) is not None


def outcome(reacted: str, lines: list[str]) -> str:
    """REFUSED by kipside (a warning, or a close that only a repeated limit leaves unlogged),
    WAITING, or FORWARDED (answered, or closed by the broker)."""
    if reacted == "nothing":
        return WAITING
    if any(ln.startswith(("WARNING ", "ERROR ")) for ln in lines):
        return REFUSED
    if reacted == "answered" or any("broker closed the connection" in ln for ln in lines):
        return FORWARDED
    return REFUSED


def client_frames() -> dict[str, bytes]:
    """The kit's frames (MALFORMED) and a few more per kind."""
    frames = dict(MALFORMED)
    metadata = bytes(craft_request(ApiKey.METADATA, 12, b"\x01\x01\x00\x00"))
    frames.update(
        {
            "truncated-size": truncated(metadata, 3),
            "tagged-fields-varint-body": bad_tagged_fields("varint"),
            "huge-partitions-array-2": huge_array("partitions"),
            "negative-topic-name-min": negative_length("topic", -(2**15)),
            # Produce v3 whose body ends inside its transactional id: no acks to read.
            "produce-too-short-for-acks": build_frame(
                encode_request_header(ApiKey.PRODUCE, 3, 1, "kit"), b"\x00"
            ),
        }
    )
    return frames


RATE_LIMITED: Final = frozenset({"huge-partitions-array", "huge-partitions-array-2"})
EXTRA_EXPECTED: Final = {
    "truncated-size": WAITING,
    "tagged-fields-varint-body": REFUSED,
    "huge-partitions-array-2": REFUSED,
    "negative-topic-name-min": REFUSED,
    "produce-too-short-for-acks": REFUSED,
}


# With --one-to-one no feature reads a ProduceRequest's body (only its acks field): the broker
# judges a malformed one, as it judges any request kipside has no reason to read.
ONE_TO_ONE: Final = {
    name: FORWARDED
    for name in (
        "huge-topics-array",
        "huge-partitions-array",
        "huge-partitions-array-2",
        "negative-topic-name",
        "negative-topic-name-min",
    )
}


def check_client_frames(
    bootstrap: str, lines_naming: Callable[[int], list[str]], *, one_to_one: bool = False
) -> None:
    """Send each client frame on a connection of its own; check what kipside did with it and
    what it logged (`lines_naming(port)`: its log lines naming that client port, each as
    "LEVEL message")."""
    expected = {**CLIENT_FRAMES, **EXTRA_EXPECTED, **(ONE_TO_ONE if one_to_one else {})}
    seen: dict[str, str] = {}
    logged: dict[str, list[str]] = {}
    for name, frame in client_frames().items():
        with connect(bootstrap) as sock:
            port = sock.getsockname()[1]
            reacted = reaction(sock, frame, QUIET if expected[name] == WAITING else WAIT)
        time.sleep(0.05)  # kipside logs as it closes; the client may see the close first
        logged[name] = lines_naming(port)
        seen[name] = outcome(reacted, logged[name])
    assert seen == expected
    print(
        f"client frames: {sum(1 for v in seen.values() if v == REFUSED)} refused, "
        f"{sum(1 for v in seen.values() if v == WAITING)} waiting, "
        f"{sum(1 for v in seen.values() if v == FORWARDED)} forwarded"
    )
    for name, lines in logged.items():
        warnings = [ln for ln in lines if ln.startswith(("WARNING ", "ERROR "))]
        if seen[name] == REFUSED and name in RATE_LIMITED:
            # The same limit as an earlier frame: kipside logs a limit once per 10 s.
            assert len(warnings) <= 1, (name, lines)
        elif seen[name] == REFUSED:
            assert len(warnings) == 1 and "closing the connection" in warnings[0], (name, lines)
        elif seen[name] == WAITING:
            assert not lines, (name, lines)
        else:
            assert not warnings, (name, lines)


def test_bad_client_frames_close_only_their_connection(
    start_kipside_in_process: StartKipside,
    tansu: Broker,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    kipside = start_kipside_in_process(tansu.bootstrap, "")
    topic = fresh_topic(kipside.bootstrap, "bad-frames", PARTITIONS, request)
    steady = SteadyProducer(kipside.bootstrap, topic).start()

    def lines_naming(port: int) -> list[str]:
        records = [r for r in caplog.records if names_port(r.getMessage(), port)]
        return [f"{r.levelname} {r.getMessage()}" for r in records]

    check_client_frames(kipside.bootstrap, lines_naming)
    assert not [r for r in caplog.records if STEADY_ID in r.getMessage()]
    steady.check()


def test_bad_client_frames_one_to_one(
    tansu: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same with `kipside serve --one-to-one` (its own process): every request goes on the
    client's own broker connection, read by the session alone (a Produce too short for its
    acks field once crashed the process here)."""
    kipside = start_kipside(tansu, tmp_path, extra_args=["--one-to-one"])
    try:
        topic = fresh_topic(kipside.bootstrap, "bad-frames-1to1", PARTITIONS, request)
        steady = SteadyProducer(kipside.bootstrap, topic).start()

        def lines_naming(port: int) -> list[str]:
            kipside.assert_alive()
            lines = [ln.split(" ", 2)[2] for ln in kipside.log().splitlines() if " kipside." in ln]
            return [ln for ln in lines if names_port(ln, port)]

        check_client_frames(kipside.bootstrap, lines_naming, one_to_one=True)
        steady.check()
        assert STEADY_ID not in kipside.log()
    finally:
        assert kipside.stop() == 0


# A hostile broker ---------------------------------------------------------------------------


def huge_metadata_v12() -> bytes:
    # throttle_time_ms, then Brokers: a compact array claiming 2**32-2 entries.
    return b"\x00\x00\x00\x00" + HUGE_VARINT + b"\x00" * 16


def huge_api_versions_v3() -> bytes:
    # error_code, then ApiKeys: a compact array claiming 2**32-2 entries.
    return b"\x00\x00" + HUGE_VARINT + b"\x00" * 16


class HostileBroker(Relay):
    """Answers the requests of clients whose client id starts with "victim-" with a corrupt
    response: "victim-array" a body claiming 2**32-2 array entries (Metadata v12, ApiVersions
    v3), "victim-size" a frame whose size claims 2**31-1 bytes."""

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        header = request.header
        who = header.client_id or ""
        if who == "victim-size":
            return (2**31 - 1).to_bytes(4, "big") + frame[4:]
        if who != "victim-array":
            return frame
        head = encode_response_header(header.api_key, header.api_version, header.correlation_id)
        if header.api_key == ApiKey.METADATA:
            return build_frame(head, huge_metadata_v12())
        if header.api_key == ApiKey.API_VERSIONS:
            return build_frame(head, huge_api_versions_v3())
        return frame


@contextmanager
def kipside_before_hostile_broker(workdir: Path) -> Iterator[Kipside]:
    """`kipside serve` (its own process: an abort must not take the test with it) in front of
    HostileBroker in front of a fresh Tansu."""
    relay = HostileBroker()
    rules = workdir / "rules.yaml"
    rules.write_text(TRANSACTION_RULES)
    with tansu_behind(relay):
        kipside = start_kipside(relay, workdir, rules)
        try:
            yield kipside
            kipside.assert_alive()
        finally:
            code = kipside.stop()
        assert code == 0, f"kipside exited with {code}"
        assert not relay.problems(), relay.problems()


HOSTILE_ANSWERS: Final = {
    # (client id, api key, version, body): what kipside must say in its one line.
    "metadata-v12-huge-brokers": (
        "victim-array",
        ApiKey.METADATA,
        12,
        b"\x01\x01\x00\x00",
        "MetadataResponse.brokers claims 4294967294 elements",
    ),
    "api-versions-v3-huge-keys": (
        "victim-array",
        ApiKey.API_VERSIONS,
        3,
        b"\x04kit\x040.1\x00",
        "ApiVersionsResponse.api_keys claims 4294967294 elements",
    ),
    "fetch-frame-size": (
        "victim-size",
        ApiKey.FETCH,
        4,
        b"\xff\xff\xff\xff" + b"\x00" * 13 + b"\x00\x00\x00\x00",
        "of 2147483647 bytes, over limits.max_frame_bytes",
    ),
}


# A client request kipside decodes with kio (a transaction call, once a rule names
# transactions): its topics claim 2**32-2 entries. kipside cannot read it, so it passes it on.
TRANSACTION_RULES: Final = (
    "transactions:\n  - transactional_id: 'txn-*'\n    outputs: [{topic: hostile-out}]\n"
)
ADD_PARTITIONS_HUGE: Final = (
    b"\x04txn"  # transactional id
    + (7).to_bytes(8, "big")  # producer id
    + (0).to_bytes(2, "big")  # producer epoch
    + HUGE_VARINT
    + b"\x00" * 16
)


def test_hostile_broker_answers_close_only_their_client(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with kipside_before_hostile_broker(tmp_path) as kipside:
        bootstrap = kipside.bootstrap
        topic = fresh_topic(bootstrap, "hostile", PARTITIONS, request)
        steady = SteadyProducer(bootstrap, topic).start()
        for name, (client_id, api_key, version, body, says) in HOSTILE_ANSWERS.items():
            with connect(bootstrap) as sock:
                port = sock.getsockname()[1]
                frame = bytes(request_frame(api_key, version, body, client_id))
                assert reaction(sock, frame, WAIT) == "closed", name
            time.sleep(0.1)  # kipside logs as it closes; the client may see the close first
            kipside.assert_alive()  # without protocol.lengths, kio aborted it here
            lines = [ln for ln in kipside.log().splitlines() if names_port(ln, port)]
            warnings = [ln for ln in lines if " WARNING " in ln or " ERROR " in ln]
            assert len(warnings) == 1 and says in warnings[0], (name, lines)
        with connect(bootstrap) as sock:
            frame = request_frame(ApiKey.ADD_PARTITIONS_TO_TXN, 3, ADD_PARTITIONS_HUGE, "txn")
            assert reaction(sock, frame, WAIT) in ("closed", "answered")
        time.sleep(0.1)
        kipside.assert_alive()  # without protocol.lengths, kio aborted it here
        steady.check()
        assert STEADY_ID not in kipside.log()


def request_frame(api_key: int, version: int, body: bytes, client_id: str) -> bytes:
    return bytes(craft_request(api_key, version, body, client_id=client_id.encode()))
