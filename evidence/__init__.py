"""Traffic evidence: what packet captures on both sides of kipside show, read independently of
kipside's own metrics.

`kipside pcap summary FILE` and `kipside pcap compare CLIENT BROKER` (cli) read captures
(tcpdump, tshark: pcap or pcapng) in bounded memory: TCP reassembled per connection with every
loss counted (reassembly), Kafka frames split and resynchronised (frames), responses matched to
requests by correlation id (connection), the bodies that matter decoded through kipside.protocol
(decode), and the figures added up (summary, transactions, latency) and compared (compare).

The scapy layers for Kafka frames (layers) dissect and craft frames, and kafka_frames (dissect)
hands over every frame of a capture, reassembled and matched, to dissect with them; the
robustness kit (craft) builds malformed frames for tests and fuzzing. The layers and the kit
import scapy, so they load on first use: the `kipside` command line registers `pcap` without
paying for scapy.

kipside.protocol does the Kafka decoding and stays free of scapy and files; this package is a
shell over it, like the proxy and the pipelines, and neither of those imports it (`make lint`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kipside.evidence.analyse import NoKafkaError, summarize
from kipside.evidence.capture import CaptureError
from kipside.evidence.cli import register_pcap
from kipside.evidence.compare import Comparison, compare
from kipside.evidence.dissect import CapturedFrame, KafkaFrames, kafka_frames
from kipside.evidence.summary import ApiFigures, ProduceFigures, Summary
from kipside.evidence.transactions import TransactionFigures

if TYPE_CHECKING:
    from kipside.evidence.craft import (
        MALFORMED,
        bad_tagged_fields,
        huge_array,
        negative_length,
        produce_request,
        request,
        truncated,
        unknown_api_key,
        wrong_size,
    )
    from kipside.evidence.layers import (
        KafkaRequest,
        KafkaResponse,
        KafkaResponseV1,
        KafkaTaggedField,
        ProducePartition,
        ProduceRequestBody,
        ProduceTopic,
        dissect_request,
        dissect_response,
    )

# Names that import scapy: loaded on first use.
_LAYERS = frozenset(
    {
        "KafkaRequest",
        "KafkaResponse",
        "KafkaResponseV1",
        "KafkaTaggedField",
        "ProducePartition",
        "ProduceRequestBody",
        "ProduceTopic",
        "dissect_request",
        "dissect_response",
    }
)
_CRAFT = frozenset(
    {
        "MALFORMED",
        "bad_tagged_fields",
        "huge_array",
        "negative_length",
        "produce_request",
        "request",
        "truncated",
        "unknown_api_key",
        "wrong_size",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LAYERS:
        from kipside.evidence import layers

        return getattr(layers, name)
    if name in _CRAFT:
        from kipside.evidence import craft

        return getattr(craft, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MALFORMED",
    "ApiFigures",
    "CaptureError",
    "CapturedFrame",
    "Comparison",
    "KafkaFrames",
    "KafkaRequest",
    "KafkaResponse",
    "KafkaResponseV1",
    "KafkaTaggedField",
    "NoKafkaError",
    "ProduceFigures",
    "ProducePartition",
    "ProduceRequestBody",
    "ProduceTopic",
    "Summary",
    "TransactionFigures",
    "bad_tagged_fields",
    "compare",
    "dissect_request",
    "dissect_response",
    "huge_array",
    "kafka_frames",
    "negative_length",
    "produce_request",
    "register_pcap",
    "request",
    "summarize",
    "truncated",
    "unknown_api_key",
    "wrong_size",
]
