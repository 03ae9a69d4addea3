"""kafka-python drivers for the integration tests: its settings, a producer, and a reader of
assigned partitions (consume_assigned's kafka-python side, clients_read_back.py).

Each gives up at its deadline instead of hanging; messages are `Msg`s (clients.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .clients import (
    EXTRA_POLL_MS,
    FLUSH_TIMEOUT,
    Msg,
    Polled,
    Watermarks,
    assigned_conf,
    python_client_common,
)


def kp_common(bootstrap: str) -> dict[str, Any]:
    return python_client_common(bootstrap, "kafka-python", reconnect_backoff_max_ms=500)


def kp_producer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        **{**kp_common(bootstrap), "linger_ms": 5, "max_block_ms": 10000, "acks": "all", **conf}
    )


def kp_send(producer: Any, topic: str, msgs: Sequence[Msg]) -> list[Any]:
    return [
        producer.send(
            topic, value=m.value, key=m.key, partition=m.partition, headers=list(m.headers)
        )
        for m in msgs
    ]


def kp_produce(bootstrap: str, topic: str, msgs: Sequence[Msg], **conf: Any) -> None:
    producer = kp_producer(bootstrap, **conf)
    try:
        futures = kp_send(producer, topic, msgs)
        producer.flush(timeout=FLUSH_TIMEOUT)
        for f in futures:
            f.get(timeout=1)  # raises the delivery error, if any
    finally:
        producer.close(timeout=5)


def kp_consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str,
    polled: Polled,
    conf: dict[str, Any],
) -> tuple[list[Msg], Watermarks]:
    """consume_assigned with kafka-python."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**assigned_conf(kp_common(bootstrap), isolation), **conf)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        while polled.wanting():
            polled.add(c.poll(timeout_ms=200))
        polled.add(c.poll(timeout_ms=EXTRA_POLL_MS))  # anything beyond `expect`?
        lows = c.beginning_offsets(tps)
        # highwater(): from the last Fetch response (see consume_assigned, in clients_read_back,
        # about ListOffsets)
        return polled.got, {tp.partition: (lows[tp], c.highwater(tp)) for tp in tps}
    finally:
        c.close(autocommit=False)
