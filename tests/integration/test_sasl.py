"""SASL through kipside with real clients, in front of a SASL-enforcing relay (relaykit.sasl).

Passthrough (the default): each client authenticates to the broker itself, through kipside, with
SaslHandshake v1 + SaslAuthenticate, or (against a relay offering only the pre-1.0 flow) with
SaslHandshake v0 and raw token frames. Each client and each mechanism is covered per flow
without running the full client x mechanism x flow product: one case per (client, flow), the
mechanisms rotated so each flow sees all three. The relay's record says who authenticated on each
upstream connection, and with which handshake.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import fresh_topic

from .clients import assert_exactly_once_in_order, make_messages, run_async
from .clients_aiokafka import aio_consume_assigned, aio_produce
from .clients_confluent import ck_produce
from .clients_kafka_python import kp_produce
from .clients_read_back import consume_assigned
from .sasl_setup import SaslSetup, ck_sasl, py_sasl, sasl_kipside

pytestmark = pytest.mark.integration

PARTITIONS = 2


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslSetup]:
    with sasl_kipside(tmp_path_factory.mktemp("sasl-v1")) as setup:
        yield setup


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslSetup]:
    with sasl_kipside(tmp_path_factory.mktemp("sasl-v0"), legacy=True) as setup:
        yield setup


def produce_and_read(setup: SaslSetup, client: str, mechanism: str, user: str) -> None:
    """`client` produces as `user` through kipside; confluent-kafka reads it all back as the
    same user; every record once, in order."""
    ck_conf = ck_sasl(mechanism, user)
    topic = fresh_topic(setup.bootstrap, "sasl", PARTITIONS, conf=ck_conf)
    msgs = make_messages(30, PARTITIONS, tag=client)
    if client == "confluent-kafka":
        ck_produce(setup.bootstrap, topic, msgs, conf=ck_conf)
    elif client == "kafka-python":
        kp_produce(setup.bootstrap, topic, msgs, **py_sasl(mechanism, user))
    else:
        run_async(aio_produce(setup.bootstrap, topic, msgs, **py_sasl(mechanism, user)))
    if client == "aiokafka":
        got, marks = run_async(
            aio_consume_assigned(
                setup.bootstrap, topic, PARTITIONS, len(msgs), **py_sasl(mechanism, user)
            )
        )
    else:
        got, marks = consume_assigned(setup.bootstrap, topic, PARTITIONS, len(msgs), conf=ck_conf)
    assert_exactly_once_in_order(msgs, got, marks)


CASES = [
    ("confluent-kafka", "PLAIN", "SCRAM-SHA-512"),
    ("kafka-python", "SCRAM-SHA-256", "PLAIN"),
    ("aiokafka", "SCRAM-SHA-512", "SCRAM-SHA-256"),
]


@pytest.mark.parametrize(("client", "mechanism", "legacy_mechanism"), CASES)
@pytest.mark.parametrize("flow", ["v1", "v0"])
def test_passthrough(
    request: pytest.FixtureRequest, flow: str, client: str, mechanism: str, legacy_mechanism: str
) -> None:
    setup: SaslSetup = request.getfixturevalue("passthrough" if flow == "v1" else "legacy")
    if flow == "v0":
        mechanism = legacy_mechanism
    before = len(setup.relay.carried())
    produce_and_read(setup, client, mechanism, "alice")
    logins = [c for c in setup.relay.authenticated()[before:] if c.user == "alice"]
    assert logins, "no upstream connection authenticated as alice"
    assert {(c.mechanism, c.handshake_version) for c in logins} == {
        (mechanism, 1 if flow == "v1" else 0)
    }
    # Nothing was refused as unauthenticated: kipside never sent a client's request on a
    # connection the client had not authenticated.
    assert [c.refused for c in setup.relay.carried() if c.refused] == []
