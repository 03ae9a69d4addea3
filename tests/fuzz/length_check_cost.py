"""What protocol.lengths costs: CPU per message of the length check next to kio's own decode.

    .venv/bin/python tests/fuzz/length_check_cost.py [--rounds 40]

The messages are the ones the proxy decodes with kio, at realistic sizes: Metadata answers
(3 brokers, 50 topics of 20 partitions, 3 replicas each), an ApiVersions v3 answer of 60 APIs,
a FindCoordinator v4 answer, a Fetch v12 request of 4 partitions (read per request when a
principals rule restricts topics), an AddPartitionsToTxn v3 request (read per transaction when
a rule names transactions). Each is timed with process_time in interleaved rounds (kio alone,
the check alone), and the best round of each is reported, so other load on the machine
inflates neither side more than the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kio.serial import entity_reader

from fuzz.skeletons import encode, skeleton
from kipside.protocol import ApiKey, request_class, response_class
from kipside.protocol.lengths import compile_check


def metadata(version: int, topics: int = 50, partitions: int = 20) -> Any:
    message = skeleton(response_class(ApiKey.METADATA, version))
    topic = message.topics[0]
    partition = dataclasses.replace(topic.partitions[0], replica_nodes=(1, 2, 3), isr_nodes=(1, 2))
    topic = dataclasses.replace(topic, partitions=(partition,) * partitions)
    names = [dataclasses.replace(topic, name=f"topic-{i:03d}") for i in range(topics)]
    return dataclasses.replace(message, brokers=message.brokers * 3, topics=tuple(names))


def api_versions() -> Any:
    message = skeleton(response_class(ApiKey.API_VERSIONS, 3))
    return dataclasses.replace(message, api_keys=message.api_keys * 60)


def fetch_request() -> Any:
    message = skeleton(request_class(ApiKey.FETCH, 12))
    topic = message.topics[0]
    topic = dataclasses.replace(topic, partitions=topic.partitions * 4)
    return dataclasses.replace(message, topics=(topic,))


def add_partitions() -> Any:
    message = skeleton(request_class(ApiKey.ADD_PARTITIONS_TO_TXN, 3))
    topic = dataclasses.replace(message.v3_and_below_topics[0], partitions=(0, 1, 2))
    return dataclasses.replace(message, v3_and_below_topics=(topic,))


MESSAGES: dict[str, Callable[[], Any]] = {
    "Metadata v12 answer, 50x20 partitions": lambda: metadata(12),
    "Metadata v1 answer, 50x20 partitions": lambda: metadata(1),
    "Metadata v12 answer, 1 partition": lambda: metadata(12, 1, 1),
    "ApiVersions v3 answer, 60 APIs": api_versions,
    "FindCoordinator v4 answer": lambda: skeleton(response_class(ApiKey.FIND_COORDINATOR, 4)),
    "Fetch v12 request, 4 partitions": fetch_request,
    "AddPartitionsToTxn v3 request": add_partitions,
}


def best_of(rounds: int, calls: list[Callable[[], object]], repeat: int) -> list[float]:
    """The best us per call of each, over interleaved rounds."""
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            began = time.process_time_ns()
            for _ in range(repeat):
                call()
            best[i] = min(best[i], (time.process_time_ns() - began) / repeat / 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    print("| message | bytes | kio decode us | length check us | check / decode |")
    print("| :-- | --: | --: | --: | --: |")
    for name, make in MESSAGES.items():
        message = make()
        data = encode(message)
        cls: Any = type(message)
        read = entity_reader(cls)
        check = compile_check(cls)
        assert check is not None and check(data, 0, len(data)) == len(data)
        repeat = max(1, 50_000 // len(data))
        calls: list[Callable[[], object]] = [
            partial(read, data, 0),
            partial(check, data, 0, len(data)),
        ]
        kio_us, check_us = best_of(args.rounds, calls, repeat)
        ratio = check_us / kio_us
        print(f"| {name} | {len(data):,} | {kio_us:.2f} | {check_us:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
