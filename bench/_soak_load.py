"""The soak's steady mixed load, in its own process: `python _soak_load.py 'JSON'`.

Runs, for `seconds`, through kipside (`bootstrap`): `producers` idempotent confluent-kafka
producers at `rate` records/s each on `topic` (coalesced on kipside's lanes), one transactional
consume-transform-produce writer on `txn_topic` (its transactional id matched by a
transactions rule, so kipside pre-registers and holds), and a consumer group of `members`
consuming `topic` at least once. Prints `READY` once every client has delivered or read
something, `STOPPING` when the steady load ends, then one JSON object: what the clients were
told, audited against the log read from the broker itself (`direct`), as the fault suite
audits (tests/integration/fault_kit/).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from _harness import REPO  # noqa: F401  (puts tests/ on sys.path)
from integration.fault_kit.audit import acked_of, audit, committed_offsets, group_offset
from integration.fault_kit.loads import (
    GroupMember,
    Load,
    SequencedProducer,
    TransactionalLoop,
    run_producers,
    wait_until,
)


@dataclass(frozen=True)
class Clients:
    producers: list[SequencedProducer]
    writer: TransactionalLoop
    members: list[GroupMember]

    @property
    def loads(self) -> list[Load]:
        return [*self.producers, self.writer, *self.members]


def start_clients(a: dict[str, Any], seconds: float) -> Clients:
    """The producers, the transactional writer and the group's members, each started."""
    bootstrap, topic, partitions = a["bootstrap"], a["topic"], int(a["partitions"])
    producers = [
        SequencedProducer(f"p{i}", bootstrap, topic, partitions, float(a["rate"]))
        for i in range(int(a["producers"]))
    ]
    writer = TransactionalLoop(
        a["txn_id"], bootstrap, a["txn_topic"], partitions, a["txn_input"], a["txn_group"]
    )
    writer.pause = float(a["txn_pause"])
    members = [
        GroupMember(f"m{i}", bootstrap, topic, a["group"], work=0.0)
        for i in range(int(a["members"]))
    ]
    for load in (*producers, writer, *members):
        load.run_timeout = seconds + 300
        load.start()
    return Clients(producers, writer, members)


def wait_working(c: Clients) -> None:
    wait_until(
        lambda: (
            all(p.delivered.acked for p in c.producers)
            and c.writer.transactions > 0
            and any(m.processed for m in c.members)
        ),
        60,
        "every client of the soak working",
    )


def drain(c: Clients) -> list[bytes]:
    """Stop the load: producers finish what they sent, the writer its transaction, the group
    reads everything acknowledged. Returns what the producers were told was acknowledged."""
    run_producers(c.producers, timeout=120)
    c.writer.stop()
    c.writer.join(120)
    acked = acked_of(c.producers)

    def consumed() -> bool:
        return len({po for m in c.members for po in m.processed}) >= len(acked)

    wait_until(consumed, 120, "the group to read everything")
    for m in c.members:
        m.stop()
    for m in c.members:
        m.join(60)
    return acked


def audited(a: dict[str, Any], c: Clients, acked: list[bytes]) -> dict[str, Any]:
    """What the clients were told, checked against the log read from the broker itself."""
    topic, partitions = a["topic"], int(a["partitions"])
    errors = [f"{x.name}: {x.error!r}" for x in c.loads if x.error is not None]
    produced = audit(a["direct"], topic, partitions, acked)
    transactional = audit(a["direct"], a["txn_topic"], partitions, c.writer.committed)
    offsets = committed_offsets(a["direct"], a["group"], topic, partitions)
    processed = [po for m in c.members for po in m.processed]
    return {
        "produce": produced.line(),
        "produce_clean": produced.clean,
        "failed_deliveries": sum(len(p.delivered.failed) for p in c.producers),
        "transactions": c.writer.transactions,
        "txn_aborted": c.writer.aborted,
        "txn": transactional.line(),
        "txn_clean": transactional.clean,
        "txn_group_offset": group_offset(a["direct"], a["txn_group"], a["txn_input"]),
        "group_processed": len(set(processed)),
        "group_reprocessed": len(processed) - len(set(processed)),
        "group_committed": sum(offsets.values()),
        "group_rebalances": sum(m.assignments for m in c.members),
        "errors": errors,
    }


def main() -> None:
    a: dict[str, Any] = json.loads(sys.argv[1])
    seconds = float(a["seconds"])
    clients = start_clients(a, seconds)
    wait_working(clients)
    print("READY", flush=True)
    time.sleep(seconds)
    print("STOPPING", flush=True)  # the steady load ends here; what follows is the audit
    acked = drain(clients)
    print(json.dumps(audited(a, clients, acked)), flush=True)


if __name__ == "__main__":
    main()
