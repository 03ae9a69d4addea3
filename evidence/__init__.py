"""Traffic evidence: what packet captures on both sides of kipside show, read independently of
kipside's own metrics.

`kipside pcap summary FILE` and `kipside pcap compare CLIENT BROKER` (cli) read captures
(tcpdump, tshark: pcap or pcapng) in bounded memory: TCP reassembled per connection with every
loss counted (reassembly), Kafka frames split and resynchronised (frames), responses matched to
requests by correlation id (connection), the bodies that matter decoded through kipside.protocol
(decode), and the figures added up (summary, transactions, latency) and compared (compare).

kafka_frames (dissect) hands over every frame of a capture, reassembled and matched, to dissect
with the scapy layers for Kafka frames, which dissect and craft frames (kipside.evidence.layers);
the robustness kit (kipside.evidence.craft) builds malformed frames for tests and fuzzing. Those
two import scapy, so they are public modules of their own, imported by name: importing this
package (as the `kipside` command line does to register `pcap`) never pays for scapy.

kipside.protocol does the Kafka decoding and stays free of scapy and files; this package is a
shell over it, like the proxy and the pipelines, and neither of those imports it (`make lint`).
"""

from __future__ import annotations

from kipside.evidence.analyse import NoKafkaError, summarize
from kipside.evidence.capture import CaptureError
from kipside.evidence.cli import register_pcap
from kipside.evidence.compare import Comparison, compare
from kipside.evidence.dissect import CapturedFrame, KafkaFrames, kafka_frames
from kipside.evidence.summary import ApiFigures, ProduceFigures, Summary
from kipside.evidence.transactions import TransactionFigures

__all__ = [
    "ApiFigures",
    "CaptureError",
    "CapturedFrame",
    "Comparison",
    "KafkaFrames",
    "NoKafkaError",
    "ProduceFigures",
    "Summary",
    "TransactionFigures",
    "compare",
    "kafka_frames",
    "register_pcap",
    "summarize",
]
