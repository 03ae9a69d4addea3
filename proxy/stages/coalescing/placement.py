"""Which lane carries each produce batch: behind the same client's outstanding batch of its
partition, on its acks value's own lane while several acks values are in use on a node, else by
a stable hash of the partition.

Pure bookkeeping: it never touches a connection.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable

# The lane of each acks value while clients of several acks values produce to one node.
_ACKS_LANE = {-1: 0, 1: 1, 0: 2}


def lane_index(topic: str, partition: int, lanes: int) -> int:
    """Stable across processes and restarts (unlike hash(), which is salted per process)."""
    return (zlib.crc32(topic.encode("utf-8")) + partition) % lanes


class LanePlacement:
    """Which lane carries each client's produce batches for a partition, keeping their order.

    Order matters per client connection and partition (a producer's sequence; Apache Kafka
    defines no order between two producers). While any batch of a client for a partition is
    outstanding (queued or in flight) on a lane, that client's next batches for it go to the
    same lane, behind it: a lane keeps them in order and a broker answers one connection's
    requests in order, so nothing overtakes. Otherwise:
    - while batches of another acks value are outstanding on the node, the batch goes to its
      acks value's lane: a ProduceRequest carries one acks value, so a lane shared by two values
      would take turns between them, halving what each request carries;
    - else partitions spread over the lanes by a stable hash, so the broker works on several
      requests at once.
    """

    def __init__(self) -> None:
        self._placed: dict[tuple[Hashable, int, str, int], list[int]] = {}
        """(client, node, topic, partition) -> [lane, outstanding batches]."""
        self._by_acks: dict[tuple[int, int], int] = {}
        """(node, acks) -> outstanding batches."""

    def place(
        self, client: Hashable, node_id: int, topic: str, partition: int, acks: int, lanes: int
    ) -> int:
        """The lane for one more batch of this client and partition (counted until release)."""
        key = (client, node_id, topic, partition)
        placed = self._placed.get(key)
        if placed is None:
            mixed = any(n and k[0] == node_id and k[1] != acks for k, n in self._by_acks.items())
            lane = _ACKS_LANE.get(acks, 0) if mixed else lane_index(topic, partition, lanes)
            placed = self._placed[key] = [lane % lanes, 0, acks]
        placed[1] += 1
        by_acks = (node_id, placed[2])
        self._by_acks[by_acks] = self._by_acks.get(by_acks, 0) + 1
        return placed[0]

    def release(self, client: Hashable, node_id: int, topic: str, partition: int) -> None:
        """One batch of this client and partition is no longer outstanding."""
        key = (client, node_id, topic, partition)
        placed = self._placed.get(key)
        if placed is None:
            return
        placed[1] -= 1
        self._by_acks[(node_id, placed[2])] -= 1
        if placed[1] <= 0:
            del self._placed[key]

    def outstanding(self) -> int:
        return sum(placed[1] for placed in self._placed.values())
