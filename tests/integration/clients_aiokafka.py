"""aiokafka drivers for the integration tests: its settings, a group member, a producer, and a
reader of assigned partitions. They are coroutines: a sync test runs them with run_async
(clients.py), which bounds them with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .clients import (
    CONSUME_TIMEOUT,
    EXTRA_POLL_MS,
    FLUSH_TIMEOUT,
    Msg,
    Polled,
    Watermarks,
    assigned_conf,
    python_client_common,
)


def aio_common(bootstrap: str) -> dict[str, Any]:
    return python_client_common(bootstrap, "aiokafka", retry_backoff_ms=50)


def aio_group_member(bootstrap: str, group: str, *topics: str, **conf: Any) -> Any:
    """An aiokafka consumer in `group` (not started) that commits by hand and starts from the
    earliest offsets, with a 6 s session and a 0.5 s heartbeat so a rebalance takes seconds.
    `conf`: more settings, or other values, in aiokafka's names."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        *topics,
        **{
            **aio_common(bootstrap),
            "group_id": group,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 500,
            "fetch_max_wait_ms": 100,
            **conf,
        },
    )


async def aio_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], **conf: Any) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**{**aio_common(bootstrap), "linger_ms": 5, "acks": "all", **conf})
    try:
        await producer.start()
        futures = [
            await producer.send(
                topic, value=m.value, key=m.key, partition=m.partition, headers=list(m.headers)
            )
            for m in msgs
        ]
        await asyncio.wait_for(asyncio.gather(*futures), FLUSH_TIMEOUT)
    finally:
        await producer.stop()


async def aio_consume_assigned(
    bootstrap: str, topic: str, partitions: int, expect: int, **conf: Any
) -> tuple[list[Msg], Watermarks]:
    """consume_assigned with aiokafka, read_uncommitted: aiokafka's transactions fail on
    Tansu 0.6.0, so nothing here reads with read_committed through it. `conf`: more settings
    (TLS, SASL)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(**assigned_conf(aio_common(bootstrap), "read_uncommitted"), **conf)
    try:
        await c.start()
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        polled = Polled(expect, CONSUME_TIMEOUT)
        while polled.wanting():
            polled.add(await c.getmany(timeout_ms=200))
        polled.add(await c.getmany(timeout_ms=EXTRA_POLL_MS))  # anything beyond `expect`?
        lows = await c.beginning_offsets(tps)
        return polled.got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        await c.stop()
