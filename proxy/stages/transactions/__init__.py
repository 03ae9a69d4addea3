"""Transaction pre-registration and the transaction-begin hold, for rule-matched producers.

For a transactional id that matches a `transactions` rule, kipside tracks the producer id and
epoch the broker confirmed (InitProducerId, EndTxn v5), the partitions and groups registered in
the current transaction, and whether kipside opened it. On the client's first
AddPartitionsToTxn or AddOffsetsToTxn of a transaction, kipside sends one upstream
AddPartitionsToTxn covering the client's partitions plus the declared outputs, and the declared
group's AddOffsetsToTxn in parallel; later client calls that are already covered are answered
locally (exactly the requested partitions, error 0) without a round trip.

The begin hold: while the coordinator is still writing the previous transaction's markers it
answers CONCURRENT_TRANSACTIONS. kipside learns when each transactional id's coordinator is
ready after EndTxn and sends the registration then (asking with DescribeTransactions where the
broker offers it), holds a registration the coordinator refuses anyway and asks again, one
question at a time, never more often than librdkafka's own backoff (`hold`, carrying out
kipside.proxy.core.begin_window), until `hold_begin.max_ms`, then gives the client the real
error; so the client never sleeps in its own backoff. The client's slot stays in its
connection's response order meanwhile.

Rules this module must never break, from Apache Kafka's transaction protocol: answer locally
only after the upstream registration under the same (producer id, epoch) succeeded (brokers
verify the first transactional write per partition); never answer
with an id or epoch the broker hasn't confirmed; end any transaction kipside opened that the
client doesn't know about; a declared topic that fails never breaks the client's transaction.

The modules: `manager` (which requests are taken, and tracking InitProducerId/EndTxn), `state`
(what is known per transactional id), `registration` (pre-registration and the client's
answer), `hold` (the begin hold), `outputs` (the rules' declared outputs as the broker knows
them), `messages` (the upstream requests kipside writes) and `answers` (its local answers).
"""

from kipside.proxy.stages.transactions.answers import add_offsets_answer, add_partitions_answer
from kipside.proxy.stages.transactions.manager import TransactionManager

__all__ = ["TransactionManager", "add_offsets_answer", "add_partitions_answer"]
