"""confluent-kafka (librdkafka) drivers for the integration tests: its settings, a producer that
asserts every delivery (or a counter of delivery reports), consumers, the offsets a group
committed, and reading assigned partitions to their end.

Each gives up with an AssertionError at its deadline instead of hanging; messages are `Msg`s
(clients.py), so their results meet the other libraries' in one exactly-once check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import confluent_kafka as ck
from testkit.produce import send_all

from .clients import FLUSH_TIMEOUT, SHORT_TIMEOUT_MS, Msg, msg_headers


def ck_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": SHORT_TIMEOUT_MS,
        "socket.connection.setup.timeout.ms": SHORT_TIMEOUT_MS,
        "topic.metadata.refresh.interval.ms": 10000,
        "client.id": "kipside-it-confluent",
    }
    conf.update(extra)
    return conf


class Deliveries:
    """What a confluent-kafka producer's delivery reports said: how many were acknowledged,
    and the errors of the others. Pass `on_delivery` to produce()."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[str] = []

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))


def ck_produce(
    bootstrap: str,
    topic: str,
    msgs: Sequence[Msg],
    producer: ck.Producer | None = None,
    flush_timeout: float = FLUSH_TIMEOUT,
    conf: dict[str, Any] | None = None,
) -> None:
    """Produce msgs with confluent-kafka (a new producer with `conf` unless one is given) and
    assert every delivery succeeded."""
    p = producer or ck.Producer(
        ck_config(bootstrap, **{"linger.ms": 5, "message.timeout.ms": 20000, **(conf or {})})
    )
    errors: list[str] = []
    records = (
        {
            "value": m.value,
            "key": m.key,
            "partition": m.partition,
            "headers": list(m.headers) or None,
        }
        for m in msgs
    )
    send_all(p, topic, records, errors)
    left = p.flush(flush_timeout)
    assert left == 0, f"{left} messages undelivered after {flush_timeout} s (errors: {errors[:3]})"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"


def ck_consumer(bootstrap: str, group: str, **conf: Any) -> ck.Consumer:
    return ck.Consumer(
        ck_config(
            bootstrap,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                **conf,
            },
        )
    )


def ck_msg(m: Any) -> Msg:
    return Msg(m.partition(), m.key(), m.value(), msg_headers(m.headers()))


def group_committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets `group` has committed for `topic`, per partition, as an admin client reads
    them (ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(ck_config(bootstrap))
    fut = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10
    )[group]
    res = fut.result(timeout=15)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topic}


def ck_read_to_end(
    consumer: ck.Consumer, partitions: int, expect: int, timeout: float
) -> list[Any]:
    """The messages of an assigned consumer (with enable.partition.eof) until `expect` arrived
    AND each of its `partitions` reported its end after that, so an extra (duplicate or
    aborted) message is caught rather than left unread."""
    got: list[Any] = []
    at_end: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout
    while len(got) < expect or len(at_end) < partitions:
        assert time.monotonic() < deadline, (
            f"got {len(got)}/{expect} after {timeout} s, at end: {sorted(at_end)}"
        )
        m = consumer.poll(0.2)
        if m is None:
            continue
        err, where = m.error(), (str(m.topic()), m.partition() or 0)
        if err is not None and err.code() == ck.KafkaError._PARTITION_EOF:
            at_end.add(where)
        elif err is not None:
            raise AssertionError(f"consumer error: {err}")
        else:
            at_end.discard(where)
            got.append(m)
    return got
