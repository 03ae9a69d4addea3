"""Multi-batch produce (KIP-712): many clients' ProduceRequests become fewer upstream requests.

The produce scheduler (core.produce_scheduler) places each batch on a lane of its node and
says when requests leave: several in flight per lane, a client's batches of one partition in
order behind each other, an idle lane sending at once and a busy one gathering what arrives
("natural batching"). Apache Kafka's rules decide what may share a request:
- at most one batch per partition per request; a later batch for the same partition waits for
  the next request, and nothing overtakes an earlier batch of its partition;
- only batches with the same acks; transactional produce never comes here;
- record batches are forwarded byte for byte (zero-copy views of the client's frame).
Each client gets exactly its own partitions back, under its own correlation id and request
version, with the throttle time copied. If the lane's connection fails, the client connections
that had a batch in flight or queued on that lane are closed, exactly as a broker disconnect
would: each client then resends its unanswered batches in order on a new connection (idempotent
producers under the same sequence numbers, which the broker de-duplicates). Answering with an
error instead would let a client's later pipelined batch overtake the retry of a failed one
(OUT_OF_ORDER_SEQUENCE_NUMBER, then an epoch bump that defeats de-duplication). Nothing is
resent by kipside.

A client's batches of one partition keep their order when its requests change route, between
the lanes and its own broker connection (a rule excluding some of a request's topics, a rule
reload): the request on the new route waits until the old route has answered that partition
(for acks=0 batches, a barrier request behind them).

The modules: `coalescer` (which requests coalesce, and the lanes), `lanes` (the trio driver of
one lane pool's scheduler), `client_produce` (one client's request, answered once each of its
partitions is), `order` (what a route change must wait for) and `stage` (the pipeline stage).
"""

from kipside.proxy.stages.coalescing.client_produce import Submitted
from kipside.proxy.stages.coalescing.coalescer import Coalescer, ProducePlan
from kipside.proxy.stages.coalescing.order import ProduceOrder

__all__ = ["Coalescer", "ProduceOrder", "ProducePlan", "Submitted"]
