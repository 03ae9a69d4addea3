"""Checks run against the broker DIRECTLY (no kipside), in a child process.

usage: python broker_probe.py CHECK BOOTSTRAP  ->  prints one JSON line {"ok": bool, "detail": str}

When a test through kipside fails, the test asks the same question of the broker itself: if
the broker fails it too, the failure is a broker limitation (the test skips with the reason),
otherwise it is a kipside bug. A child process keeps the test process from ever holding a
connection to the broker (the socket-table test relies on that).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic


def _topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"probe-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=10).values():
        fut.result(timeout=15)
    return name


def read_committed_filters_aborted(bootstrap: str) -> tuple[bool, str]:
    """Abort a transaction, commit one: does a read_committed consumer skip the aborted one?"""
    topic = _topic(bootstrap)
    p = ck.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": topic, "socket.timeout.ms": 5000}
    )
    p.init_transactions(10)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        p.begin_transaction()
        p.produce(topic, value, partition=0)
        assert p.flush(10) == 0
        (p.commit_transaction if commit else p.abort_transaction)(10)
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "socket.timeout.ms": 5000,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            break  # end of partition (at the last stable offset)
        got.append(m.value() or b"")
    c.close()
    return got == [b"committed"], f"read_committed consumer saw {got}"


def aiokafka_idempotence(bootstrap: str) -> tuple[bool, str]:
    from aiokafka import AIOKafkaProducer

    topic = _topic(bootstrap)

    async def run() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, request_timeout_ms=10000
        )
        await p.start()
        try:
            await asyncio.wait_for(p.send_and_wait(topic, b"x", partition=0), 15)
        finally:
            await p.stop()

    try:
        asyncio.run(run())
    except Exception as exc:
        return False, f"aiokafka idempotent produce failed: {exc!r}"
    return True, "aiokafka idempotent produce works"


CHECKS: dict[str, Callable[[str], tuple[bool, str]]] = {
    "read-committed-filters-aborted": read_committed_filters_aborted,
    "aiokafka-idempotence": aiokafka_idempotence,
}


def main() -> None:
    check, bootstrap = sys.argv[1:3]
    try:
        ok, detail = CHECKS[check](bootstrap)
    except Exception as exc:
        ok, detail = False, f"probe raised {exc!r}"
    print(json.dumps({"ok": ok, "detail": detail}), flush=True)


if __name__ == "__main__":
    main()
