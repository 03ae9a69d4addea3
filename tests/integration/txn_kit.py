"""What the transaction tests (test_transactions_*.py) share: the stack they run on,
the clients' own logs of what they were answered, and a transactional producer of either
client library.

kipside pre-registers a rule-matched transaction's declared outputs and consumer group on the
client's first AddPartitionsToTxn/AddOffsetsToTxn, answers later covered calls itself, and holds
a registration through CONCURRENT_TRANSACTIONS (the coordinator still writing the previous
transaction's markers) until the rule's hold_begin.max_ms. Tansu 0.6.0 has no marker-writing
window, so every stack here puts a MarkerWindowRelay (tests/txn_relay.py, a fault-injecting
SIMULATION of Apache Kafka's coordinator) between kipside and a dedicated Tansu: for W ms after
each successful EndTxn it answers that transactional id's AddPartitionsToTxn/AddOffsetsToTxn
with CONCURRENT_TRANSACTIONS itself, and it counts, independently of kipside, what kipside sent
upstream per transaction. It also answers InitProducerId v0-1 as Apache Kafka does (Tansu 0.6.0
fails them, and aiokafka sends nothing else), and, for a stack made with
`describe_transactions=True`, it offers and answers DescribeTransactions as a 3.0+
coordinator does.

What the clients themselves saw is read from their own logs: librdkafka's `eos` debug log (one
line per AddPartitionsToTxn/AddOffsetsToTxn answer that carried an error) and kafka-python's
TransactionManager DEBUG records (the decoded response objects); aiokafka logs none, so its
response handlers are wrapped to keep the error codes they are given (AiokafkaTxnLog).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import confluent_kafka as ck
import pytest
from conftest import skip_unless_shared_lanes
from relaykit.tansu import tansu_behind
from testkit.broker import Broker
from testkit.kipside import Kipside, start_kipside
from testkit.metrics import Metrics, scrape
from testkit.ports import free_port
from txn_relay import CONCURRENT_TRANSACTIONS, MarkerWindowRelay

from .clients import call_with_deadline
from .clients_confluent import ck_config, ck_consumer
from .clients_kafka_python import kp_producer

CLIENTS = ["confluent-kafka", "kafka-python"]
"""The transactional producers of TxnClient (aiokafka's loop is in txn_ctp.py)."""
WINDOW_MS = 50.0  # the simulated marker-writing window after each EndTxn
OUT_PARTITIONS = 8
HOLD_MAX_MS = 5000
CALL_TIMEOUT = 15.0  # one client call (commit, abort, flush, send offsets)

# librdkafka's eos debug log names the error by its description (rd_kafka_err2str) or its name.
RDKAFKA_CONCURRENT = re.compile(
    r"CONCURRENT_TRANSACTIONS|another concurrent operation on the same transaction"
)


# --------------------------------------------------------------------------- the stack


@dataclass
class TxnStack:
    """Tansu advertising the relay, the relay in front of it, kipside in front of the relay."""

    relay: MarkerWindowRelay
    broker: Broker  # bootstrap = the relay: what kipside dials and what Tansu advertises
    kipside: Kipside
    admin_port: int

    @property
    def bootstrap(self) -> str:
        return self.kipside.bootstrap

    def metrics(self) -> Metrics:
        """kipside's /metrics."""
        return scrape(self.admin_port)

    def api_metric(self, name: str, api: str) -> float:
        return self.metrics().value(name, 0.0, api=api)


class Output(NamedTuple):
    topic: str
    partitions: tuple[int, ...] | None = None  # None: every partition


def rules_yaml(transactional_id: str, outputs: list[Output], group: str | None, max_ms: int) -> str:
    lines = ["transactions:", f'  - transactional_id: "{transactional_id}"', "    outputs:"]
    for out in outputs:
        lines.append(f"      - topic: {out.topic}")
        if out.partitions is not None:
            lines.append(f"        partitions: [{', '.join(map(str, out.partitions))}]")
    if group is not None:
        lines.append(f"    consumer_group: {group}")
    lines.append(f"    hold_begin: {{max_ms: {max_ms}}}")
    return "\n".join(lines) + "\n"


StackFactory = Callable[..., TxnStack]


def assert_no_kipside_errors(kipside: Kipside) -> list[str]:
    """kipside logged nothing at ERROR and no traceback; returns its WARNING lines."""
    lines = kipside.log().splitlines()
    bad = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln or "Traceback" in ln]
    assert not bad, "kipside logged errors:\n" + "\n".join(bad[:10])
    return [ln for ln in lines if " WARNING " in ln]


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[StackFactory]:
    """make_stack(rules_text, window_ms=WINDOW_MS, describe_transactions=False) -> a new
    TxnStack; all stopped at the end
    (kipside must exit 0 on SIGTERM). A test module takes it as `make_stack = kit.make_stack`
    (imported by name, a fixture would be an unused import to ruff)."""
    skip_unless_shared_lanes("transaction pre-registration")
    made: list[Kipside] = []
    brokers = contextlib.ExitStack()

    def make(
        rules_text: str, window_ms: float = WINDOW_MS, describe_transactions: bool = False
    ) -> TxnStack:
        relay = MarkerWindowRelay(
            window_ms=window_ms,
            describe_transactions=describe_transactions,
            init_producer_id_v0=True,
        )
        tansu = brokers.enter_context(tansu_behind(relay))
        workdir = tmp_path / f"stack{len(made) + 1}"
        workdir.mkdir()
        rules = workdir / "rules.yaml"
        rules.write_text(rules_text)
        admin_port = free_port()
        via_relay = replace(tansu, port=relay.port)
        kipside = start_kipside(
            via_relay, workdir, rules=rules, extra_args=["--admin", f"127.0.0.1:{admin_port}"]
        )
        made.append(kipside)
        stdout = kipside.stdout_path.read_text()
        assert f"kipside: admin listening on http://127.0.0.1:{admin_port}" in stdout, stdout
        return TxnStack(relay, via_relay, kipside, admin_port)

    with brokers:
        try:
            yield make
            for kipside in made:
                code = kipside.stop()
                assert code == 0, f"kipside exited with {code}:\n{kipside.log()[-3000:]}"
        finally:
            for kipside in made:
                if kipside.proc.poll() is None:
                    kipside.proc.kill()


# --------------------------------------------------------------------------- client logs


class RdkafkaLog(logging.Handler):
    """librdkafka's log lines for one client (config: {"debug": "eos", "logger": .logger})."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"kipside-tests.rdkafka.{uuid.uuid4().hex[:8]}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def concurrent(self) -> list[str]:
        """The answers carrying CONCURRENT_TRANSACTIONS this client got (one line each)."""
        return [line for line in self.lines if RDKAFKA_CONCURRENT.search(line)]

    def conf(self) -> dict[str, Any]:
        return {"debug": "eos", "logger": self.logger}


class KafkaPythonTxnLog(logging.Handler):
    """kafka-python's TransactionManager DEBUG records: every transactional response it
    received ("Received transactional response %s for request %s"), decoded."""

    LOGGER = "kafka.producer.transaction_manager"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.responses: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Received transactional response") and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            self.responses.append(args[0])

    @contextlib.contextmanager
    def attached(self) -> Iterator[KafkaPythonTxnLog]:
        logger = logging.getLogger(self.LOGGER)
        level, propagate = logger.level, logger.propagate
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # keep thousands of DEBUG records out of pytest's capture
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate

    def concurrent(self) -> list[str]:
        """The responses carrying CONCURRENT_TRANSACTIONS this client got."""
        return [type(r).__name__ for r in self.responses if CONCURRENT_TRANSACTIONS in _codes(r)]

    def kinds(self) -> Counter[str]:
        return Counter(type(r).__name__ for r in self.responses)


class AiokafkaTxnLog:
    """The error codes aiokafka's AddPartitionsToTxn and AddOffsetsToTxn handlers are given
    while attached (aiokafka logs no CONCURRENT_TRANSACTIONS answer)."""

    def __init__(self) -> None:
        self.codes: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def attached(self) -> Iterator[AiokafkaTxnLog]:
        from aiokafka.producer import sender

        patched = []
        for name in ("AddPartitionsToTxnHandler", "AddOffsetsToTxnHandler"):
            handler = getattr(sender, name)
            original = handler.handle_response

            def handle(
                self_: Any, response: Any, _original: Any = original, _name: str = name
            ) -> Any:
                for code in _codes(response, aiokafka=True):
                    self.codes.append((_name, code))
                return _original(self_, response)

            handler.handle_response = handle
            patched.append((handler, original))
        try:
            yield self
        finally:
            for handler, original in patched:
                handler.handle_response = original

    def concurrent(self) -> list[str]:
        return [name for name, code in self.codes if code == CONCURRENT_TRANSACTIONS]


def _codes(response: Any, aiokafka: bool = False) -> set[int]:
    """Every error code in a kafka-python transactional response object."""
    codes = set()
    if isinstance(getattr(response, "error_code", None), int):
        codes.add(response.error_code)
    for topic in getattr(response, "results_by_topic_v3_and_below", None) or ():
        for partition in topic.results_by_partition:
            codes.add(int(partition.partition_error_code))
    if aiokafka:  # AddPartitionsToTxn: errors = [(topic, [(partition, code)])]
        for _topic, partitions in getattr(response, "errors", None) or ():
            codes.update(int(code) for _partition, code in partitions)
    return codes


# ---------------------------------------------------------------- a transactional producer


class TxnClient:
    """One transactional producer of either client library, with deadlines on every call and
    a count of the CONCURRENT_TRANSACTIONS answers it received."""

    def __init__(self, client: str, bootstrap: str, txn_id: str) -> None:
        self.client = client
        self.bootstrap = bootstrap
        self.rdkafka_log: RdkafkaLog | None = None
        self.kp_log: KafkaPythonTxnLog | None = None
        self._kp_attached: contextlib.ExitStack = contextlib.ExitStack()
        if client == "confluent-kafka":
            self.rdkafka_log = RdkafkaLog()
            conf = {
                "transactional.id": txn_id,
                "linger.ms": 1,
                "message.timeout.ms": 15000,
                **self.rdkafka_log.conf(),
            }
            self.ck = ck.Producer(ck_config(bootstrap, **conf))
        else:
            self.kp_log = KafkaPythonTxnLog()
            self._kp_attached.enter_context(self.kp_log.attached())
            self.kp = kp_producer(bootstrap, transactional_id=txn_id, linger_ms=1)

    def init(self) -> None:
        if self.client == "confluent-kafka":
            self.ck.init_transactions(CALL_TIMEOUT)
        else:
            call_with_deadline(self.kp.init_transactions, CALL_TIMEOUT, "init_transactions")

    def produce_in_transaction(
        self, topic: str, values: list[tuple[int, bytes]], begin: bool = True
    ) -> None:
        """begin (unless begin=False), send each (partition, value), flush: raises what the
        client raises."""
        if self.client == "confluent-kafka":
            errors: list[Any] = []
            if begin:
                self.ck.begin_transaction()
            for partition, value in values:
                self.ck.produce(
                    topic,
                    value=value,
                    partition=partition,
                    on_delivery=lambda err, _m: errors.append(err) if err else None,
                )
            left = self.ck.flush(CALL_TIMEOUT)
            if errors:
                raise ck.KafkaException(errors[0])
            assert left == 0, f"{left} undelivered"
        else:
            if begin:
                self.kp.begin_transaction()
            futures = [self.kp.send(topic, value=v, partition=p) for p, v in values]
            self.kp.flush(timeout=CALL_TIMEOUT)
            for future in futures:
                future.get(timeout=1)

    def send_offsets(self, topic: str, offset: int, group: str) -> None:
        if self.client == "confluent-kafka":
            consumer = ck_consumer(self.bootstrap, group)
            try:
                self.ck.send_offsets_to_transaction(
                    [ck.TopicPartition(topic, 0, offset)],
                    consumer.consumer_group_metadata(),
                    CALL_TIMEOUT,
                )
            finally:
                consumer.close()
        else:
            from kafka import TopicPartition
            from kafka.structs import OffsetAndMetadata

            call_with_deadline(
                functools.partial(
                    self.kp.send_offsets_to_transaction,
                    {TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)},
                    group,
                ),
                CALL_TIMEOUT,
                "send_offsets_to_transaction",
            )

    def commit(self) -> None:
        if self.client == "confluent-kafka":
            self.ck.commit_transaction(CALL_TIMEOUT)
        else:
            call_with_deadline(self.kp.commit_transaction, CALL_TIMEOUT, "commit_transaction")

    def concurrent_seen(self) -> list[str]:
        if self.rdkafka_log is not None:
            self.ck.poll(0)  # serve queued log lines
            return self.rdkafka_log.concurrent()
        assert self.kp_log is not None
        return self.kp_log.concurrent()

    def close(self) -> None:
        try:
            if self.client == "confluent-kafka":
                self.ck.flush(1)
            else:
                self.kp.close(timeout=2)
        finally:
            self._kp_attached.close()
