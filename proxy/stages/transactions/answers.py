"""kipside's own answers to a client's AddPartitionsToTxn (v0-3) and AddOffsetsToTxn.

A local AddPartitionsToTxn answer lists exactly the requested partitions, in request order, each
with its error (0 if none), throttle 0, under the client's correlation id and header version: a
missing partition stalls Java, librdkafka, kafka-python and aiokafka, an extra one crashes aiokafka,
an empty result crashes Java. Public: the tests' fault-injecting relays answer for a simulated
broker with these same frames.
"""

from __future__ import annotations

import datetime
from typing import Final

from kio.static.primitive import i32Timedelta

from kipside.protocol import (
    ApiKey,
    ErrorCode,
    Message,
    RequestHeader,
    encode_message,
    field_entity,
    response_class,
    response_frame,
)
from kipside.proxy.stages.transactions.state import TopicPartition

NONE: Final = 0
_ZERO = datetime.timedelta(0)


def add_partitions_answer(
    header: RequestHeader, request: Message, errors: dict[TopicPartition, int]
) -> bytes:
    """An AddPartitionsToTxn v0-3 response frame answering `request` (sent with `header`):
    exactly the requested partitions, in request order, with their error (0 if none)."""
    cls = response_class(ApiKey.ADD_PARTITIONS_TO_TXN, header.api_version)
    topic_cls = field_entity(cls, "results_by_topic_v3_and_below")
    partition_cls = field_entity(topic_cls, "results_by_partition")
    message = cls(
        throttle_time=i32Timedelta.parse(_ZERO),
        results_by_topic_v3_and_below=tuple(
            topic_cls(
                name=topic.name,
                results_by_partition=tuple(
                    partition_cls(
                        partition_index=p,
                        partition_error_code=ErrorCode(errors.get((topic.name, int(p)), NONE)),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.v3_and_below_topics
        ),
    )
    return response_frame(header, encode_message(message))


def add_offsets_answer(header: RequestHeader, code: int) -> bytes:
    """An AddOffsetsToTxn response frame answering the request sent with `header`."""
    cls = response_class(ApiKey.ADD_OFFSETS_TO_TXN, header.api_version)
    message = cls(throttle_time=i32Timedelta.parse(_ZERO), error_code=ErrorCode(code))
    return response_frame(header, encode_message(message))
