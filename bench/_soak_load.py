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


def main() -> None:
    a: dict[str, Any] = json.loads(sys.argv[1])
    seconds = float(a["seconds"])
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
    loads: list[Load] = [*producers, writer, *members]
    for load in loads:
        load.run_timeout = seconds + 300
        load.start()
    wait_until(
        lambda: (
            all(p.delivered.acked for p in producers)
            and writer.transactions > 0
            and any(m.processed for m in members)
        ),
        60,
        "every client of the soak working",
    )
    print("READY", flush=True)
    time.sleep(seconds)
    print("STOPPING", flush=True)  # the steady load ends here; what follows is the audit
    run_producers(producers, timeout=120)
    writer.stop()
    writer.join(120)
    acked = acked_of(producers)

    def consumed() -> bool:
        return len({po for m in members for po in m.processed}) >= len(acked)

    wait_until(consumed, 120, "the group to read everything")
    for m in members:
        m.stop()
    for m in members:
        m.join(60)
    errors = [f"{x.name}: {x.error!r}" for x in loads if x.error is not None]
    produced = audit(a["direct"], topic, partitions, acked)
    transactional = audit(a["direct"], a["txn_topic"], partitions, writer.committed)
    offsets = committed_offsets(a["direct"], a["group"], topic, partitions)
    processed = [po for m in members for po in m.processed]
    print(
        json.dumps(
            {
                "produce": produced.line(),
                "produce_clean": produced.clean,
                "failed_deliveries": sum(len(p.delivered.failed) for p in producers),
                "transactions": writer.transactions,
                "txn_aborted": writer.aborted,
                "txn": transactional.line(),
                "txn_clean": transactional.clean,
                "txn_group_offset": group_offset(a["direct"], a["txn_group"], a["txn_input"]),
                "group_processed": len(set(processed)),
                "group_reprocessed": len(processed) - len(set(processed)),
                "group_committed": sum(offsets.values()),
                "group_rebalances": sum(m.assignments for m in members),
                "errors": errors,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
