"""What the integration tests' drivers of the three real Kafka clients share.

Messages are compared as `Msg(partition, key, value, headers)` so all clients can share one
exactly-once check (assert_exactly_once_in_order). The drivers themselves are one module per
library (clients_confluent, clients_kafka_python, clients_aiokafka), read back with any of them
in clients_read_back; raw_batches reads what the broker stored. Every driver talks to a real
broker (through kipside or directly) and gives up with an AssertionError/TimeoutError at its
deadline instead of hanging: run_async and call_with_deadline bound the calls that have none.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

SHORT_TIMEOUT_MS = 5000
REQUEST_TIMEOUT_MS = 10000
FLUSH_TIMEOUT = 30.0
CONSUME_TIMEOUT = 30.0
EXTRA_POLL_MS = 300
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]


class Msg(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


Watermarks = dict[int, tuple[int, int]]


def make_messages(
    n: int, partitions: int, tag: str = "m", headers: bool = True, size: int = 120
) -> list[Msg]:
    """n messages spread round-robin over explicit partitions, compressible, in send order."""
    out = []
    for i in range(n):
        body = f"{tag}-{i:06d}|".encode()
        value = body + b"kipside-" * max(0, (size - len(body)) // 8)
        hdrs = (("seq", str(i).encode()), ("tag", tag.encode())) if headers else ()
        out.append(Msg(i % partitions, f"k{i}".encode(), value, hdrs))
    return out


def by_partition(msgs: Iterable[Msg]) -> dict[int, list[Msg]]:
    out: dict[int, list[Msg]] = defaultdict(list)
    for m in msgs:
        out[m.partition].append(m)
    return dict(out)


def assert_exactly_once_in_order(
    sent: Sequence[Msg], received: Sequence[Msg], watermarks: Watermarks | None = None
) -> None:
    """Every sent message was received once, with its content, in send order per partition.

    If watermarks (partition -> (low, high)) are given, the log holds exactly what was sent:
    no duplicate was written even if the consumer did not see it.
    """
    want, got = by_partition(sent), by_partition(received)
    assert len(received) == len(sent), f"received {len(received)} messages, sent {len(sent)}"
    for p in sorted(set(want) | set(got)):
        w, g = want.get(p, []), got.get(p, [])
        if w != g:
            first = next(
                (i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b),
                min(len(w), len(g)),
            )
            raise AssertionError(
                f"partition {p}: sent {len(w)}, received {len(g)}; first difference at #{first}: "
                f"sent {w[first : first + 1]!r} received {g[first : first + 1]!r}"
            )
    if watermarks is not None:
        in_log = {p: hi - lo for p, (lo, hi) in watermarks.items()}
        want_counts = {p: len(want.get(p, [])) for p in watermarks}
        assert in_log == want_counts, (
            f"log holds {in_log} records per partition, sent {want_counts}"
        )


def msg_headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    """A client's record headers (name, value or None) as a Msg's."""
    return tuple((k, bytes(v) if v is not None else b"") for k, v in (raw or ()))


def python_client_common(bootstrap: str, client: str, **extra: Any) -> dict[str, Any]:
    """The settings kafka-python and aiokafka share (they take the same names)."""
    return {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "client_id": f"kipside-it-{client}",
        **extra,
    }


# librdkafka's names of the security settings (confluent-kafka, kcat), and kafka-python's for
# the same (aiokafka's too, but for the CA, which aiokafka takes as an ssl_context).
PYTHON_CLIENT_NAMES = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}


def python_client_names(conf: dict[str, Any]) -> dict[str, Any]:
    """librdkafka's security settings in kafka-python's and aiokafka's names."""
    return {PYTHON_CLIENT_NAMES[name]: value for name, value in conf.items()}


def assigned_conf(common: dict[str, Any], isolation: str) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings for a consumer of assigned partitions."""
    return {
        **common,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": isolation,
        "fetch_max_wait_ms": 100,
    }


class Polled:
    """What kafka-python's poll() or aiokafka's getmany() returned so far, as Msgs."""

    def __init__(self, expect: int, timeout: float) -> None:
        self.got: list[Msg] = []
        self.expect, self.timeout = expect, timeout
        self.deadline = time.monotonic() + timeout

    def wanting(self) -> bool:
        """Whether fewer than `expect` arrived; an AssertionError once the time is up."""
        got, expect = len(self.got), self.expect
        if got >= expect:
            return False
        assert time.monotonic() < self.deadline, f"got {got}/{expect} after {self.timeout} s"
        return True

    def add(self, batches: dict[Any, list[Any]]) -> None:
        for records in batches.values():
            self.got.extend(
                Msg(r.partition, r.key, r.value, msg_headers(r.headers)) for r in records
            )


def run_async(coro: Any, timeout: float = 60.0) -> Any:
    """Run an asyncio coroutine (aiokafka) from a sync test with a hard deadline."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def call_with_deadline(fn: Any, timeout: float, what: str) -> Any:
    """Run a blocking client call that has no timeout of its own, in a daemon thread.

    Raises TimeoutError after `timeout` s (the thread is abandoned, the test fails).
    """
    import threading

    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=run, name=f"deadline:{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{what} did not return within {timeout} s")
    if error:
        raise error[0]
    return result[0] if result else None
