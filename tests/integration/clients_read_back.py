"""Reading a topic back with any of the three client libraries: every partition by assignment
(no group) until the messages sent arrived, with the log's watermarks, so a test can check
exactly once with assert_exactly_once_in_order (clients.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import confluent_kafka as ck

from .clients import CONSUME_TIMEOUT, Msg, Polled, Watermarks, run_async
from .clients_aiokafka import aio_consume_assigned, aio_produce
from .clients_confluent import ck_consumer, ck_msg, ck_produce, ck_read_to_end
from .clients_kafka_python import kp_consume_assigned, kp_produce


def consume_assigned(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    isolation: str = "read_uncommitted",
    timeout: float = CONSUME_TIMEOUT,
    *,
    client: str = "confluent-kafka",
    conf: dict[str, Any] | None = None,
) -> tuple[list[Msg], Watermarks]:
    """Read every partition from the beginning (no group) until `expect` messages arrived, with
    confluent-kafka (which then waits for every partition's end, see ck_read_to_end) or with
    kafka-python (which stops at `expect` and polls once more). `conf`: more client settings
    (TLS, SASL), in the client's own names."""
    if client == "kafka-python":
        return kp_consume_assigned(
            bootstrap, topic, partitions, isolation, Polled(expect, timeout), conf or {}
        )
    assert client == "confluent-kafka", f"no assigned reader for {client!r}"
    c = ck_consumer(
        bootstrap,
        f"unused-{topic}",
        **{"isolation.level": isolation, "enable.partition.eof": True, **(conf or {})},
    )
    try:
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        got = [ck_msg(m) for m in ck_read_to_end(c, partitions, expect, timeout)]
        # cached=True: the high watermark of the last Fetch response. Tansu 0.6.0 answers
        # ListOffsets(latest) with (base offset of the last batch) + 1, which is wrong for
        # multi-record batches (a broker bug, seen without kipside), so ListOffsets is not used.
        marks = {
            p: c.get_watermark_offsets(ck.TopicPartition(topic, p), cached=True)
            for p in range(partitions)
        }
        return got, marks
    finally:
        c.close()


def produce_and_read_back(
    client: str,
    bootstrap: str,
    topic: str,
    msgs: Sequence[Msg],
    partitions: int,
    conf: dict[str, Any],
) -> tuple[list[Msg], Watermarks]:
    """`client` (confluent-kafka, kafka-python or aiokafka) produces `msgs`, then reads the
    topic's `partitions` back by assignment until all arrived (consume_assigned); `conf`: more
    settings (TLS, SASL) for both, in the client's own names."""
    if client == "aiokafka":
        run_async(aio_produce(bootstrap, topic, msgs, **conf))
        read = aio_consume_assigned(bootstrap, topic, partitions, len(msgs), **conf)
        found: tuple[list[Msg], Watermarks] = run_async(read)
        return found
    if client == "kafka-python":
        kp_produce(bootstrap, topic, msgs, **conf)
    else:
        ck_produce(bootstrap, topic, msgs, conf=conf)
    return consume_assigned(bootstrap, topic, partitions, len(msgs), client=client, conf=conf)
