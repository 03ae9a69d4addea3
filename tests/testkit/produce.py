"""Producing known records with confluent-kafka, for tests that compare with what they sent.

`send_all` hands each record to librdkafka, waiting out a full local queue (BufferError) by
serving delivery reports, and collects the text of every failed delivery, so the caller's
flush-and-check sees them all. It never flushes: when to wait for delivery is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka as ck


def send_all(
    producer: ck.Producer, topic: str, records: Iterable[Mapping[str, Any]], errors: list[str]
) -> None:
    """Produce each record (the keyword arguments of `Producer.produce`: value, key, partition,
    headers, timestamp) to `topic`; the text of each failed delivery goes to `errors` once
    poll() or flush() serves its report."""

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for record in records:
        while True:
            try:
                producer.produce(topic, **record, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
