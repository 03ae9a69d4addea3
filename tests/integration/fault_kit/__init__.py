"""What the fault scenarios (fault_scenarios/, run by test_faults_*.py and bench/faults.py) and
bench/soak.py's load share, one module a behaviour:

- stack.py: a real Tansu that advertises a FaultRelay (tests/relaykit/faults.py), the relay in
  front of it, and `kipside serve` (a subprocess) whose --upstream is the relay, so every byte
  kipside exchanges with the broker crosses the relay, which the test cuts, blackholes, stalls
  or slows. The broker is never restarted: it keeps its data in memory only.
- loads.py: the clients, each in a thread: `SequencedProducer`, a confluent-kafka idempotent
  producer that writes "NAME|P|SEQ" into partition P (SEQ counting up per partition) and keeps
  what the broker acknowledged and what failed; an at-least-once kafka-python producer; a
  transactional consume-transform-produce writer; consumer-group members.
- audit.py: reads the topic from the broker itself (not through kipside or the relay), record
  batches and transaction markers included (txn_log.read_log/resolve: read_committed
  as specified, since Tansu's Fetch carries no AbortedTransactions), and counts what a user
  cares about: every acknowledged message in the log exactly once, in order per producer and
  partition.
"""
