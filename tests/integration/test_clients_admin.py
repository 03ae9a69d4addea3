"""Real admin clients through kipside to the real broker (Tansu): topics are created and
listed, a duplicate is an error the client sees, and every broker address in the answers is
one the client may dial (kipside's, when going through kipside).
"""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import Target, unique_name

from .clients_confluent import ck_config
from .clients_kafka_python import kp_common

pytestmark = pytest.mark.integration


def _allowed_ports(target: Target) -> set[int]:
    return target.kipside.ports if target.kipside else {target.broker.port}


def test_confluent_admin_create_list(target: Target, request: pytest.FixtureRequest) -> None:
    admin = AdminClient(ck_config(target.bootstrap))
    names = {unique_name("adm2", request): 2, unique_name("adm5", request): 5}
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=p, replication_factor=1) for n, p in names.items()],
        operation_timeout=10,
        request_timeout=10,
    )
    for fut in futures.values():
        fut.result(timeout=15)
    md = admin.list_topics(timeout=10)
    for name, count in names.items():
        assert name in md.topics, f"{name} missing from {sorted(md.topics)}"
        assert len(md.topics[name].partitions) == count
        assert md.topics[name].error is None
    assert md.brokers, "no brokers in metadata"
    for b in md.brokers.values():
        assert b.host == "127.0.0.1" and b.port in _allowed_ports(target), b
    # creating an existing topic is an error the client must see (not swallowed)
    dup = admin.create_topics([NewTopic(next(iter(names)), 2, 1)], request_timeout=10)
    with pytest.raises(ck.KafkaException) as exc_info:
        next(iter(dup.values())).result(timeout=15)
    assert exc_info.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    cluster = admin.describe_cluster(request_timeout=10).result(timeout=15)
    for node in cluster.nodes:
        assert node.port in _allowed_ports(target), node


def test_kafka_python_admin_create_list(target: Target, request: pytest.FixtureRequest) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(**kp_common(target.bootstrap))
    try:
        names = {unique_name("kadm1", request): 1, unique_name("kadm4", request): 4}
        admin.create_topics(
            {n: {"num_partitions": p, "replication_factor": 1} for n, p in names.items()},
            timeout_ms=10000,
        )
        listed = set(admin.list_topics())
        assert set(names) <= listed, f"{set(names) - listed} missing from {sorted(listed)}"
        described = {t["name"]: t for t in admin.describe_topics(list(names))}
        for name, count in names.items():
            assert len(described[name]["partitions"]) == count, described[name]
        cluster = admin.describe_cluster()
        assert cluster["brokers"], cluster
        for b in cluster["brokers"]:
            assert b["port"] in _allowed_ports(target), b
    finally:
        admin.close()
