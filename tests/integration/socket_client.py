"""A Kafka client in its own process, for the socket-table test.

usage: python socket_client.py CLIENT BOOTSTRAP TOPIC GROUP PARTITIONS

Produces 20 messages, consumes them back (confluent-kafka and aiokafka as a consumer group, so
the coordinator address is exercised; kafka-python by assignment, since its group consume does
not work against Tansu), prints `READY <consumed>` and keeps every connection open until its
stdin closes (or 60 s pass), so the parent can inspect this process's sockets.
"""

from __future__ import annotations

import asyncio
import os
import select
import sys
import time

N = 20
SELF_TIMEOUT = 60.0


def wait_for_parent() -> None:
    # select() before each read, so this returns after SELF_TIMEOUT even if stdin stays open.
    deadline = time.monotonic() + SELF_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            return


def confluent(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    import confluent_kafka as ck

    common = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000}
    p = ck.Producer({**common, "linger.ms": 5})
    for i in range(N):
        p.produce(topic, f"sock-{i}".encode(), partition=i % partitions)
    assert p.flush(20) == 0
    c = ck.Consumer(
        {
            **common,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < N and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    print(f"READY {got}", flush=True)
    wait_for_parent()
    c.close()
    return got


def kafka_python(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    common = {"bootstrap_servers": bootstrap, "request_timeout_ms": 10000}
    p = KafkaProducer(**common, linger_ms=5, max_block_ms=10000)
    for i in range(N):
        p.send(topic, f"sock-{i}".encode(), partition=i % partitions)
    p.flush(timeout=20)
    c = KafkaConsumer(**common, group_id=None, auto_offset_reset="earliest")
    tps = [TopicPartition(topic, i) for i in range(partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got = 0
    deadline = time.monotonic() + 30
    while got < N and time.monotonic() < deadline:
        got += sum(len(v) for v in c.poll(timeout_ms=200).values())
    print(f"READY {got}", flush=True)
    wait_for_parent()
    c.close()
    p.close(timeout=5)
    return got


async def aiokafka_main(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await p.start()
    for i in range(N):
        await p.send(topic, f"sock-{i}".encode(), partition=i % partitions)
    await p.flush()
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    await c.start()
    got = 0
    deadline = time.monotonic() + 30
    while got < N and time.monotonic() < deadline:
        got += sum(len(v) for v in (await c.getmany(timeout_ms=200)).values())
    await c.commit()
    print(f"READY {got}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, wait_for_parent)
    await c.stop()
    await p.stop()
    return got


def main() -> None:
    client, bootstrap, topic, group, partitions = sys.argv[1:6]
    args = (bootstrap, topic, group, int(partitions))
    if client == "confluent-kafka":
        confluent(*args)
    elif client == "kafka-python":
        kafka_python(*args)
    elif client == "aiokafka":
        asyncio.run(asyncio.wait_for(aiokafka_main(*args), SELF_TIMEOUT + 30))
    else:
        raise SystemExit(f"unknown client {client}")


if __name__ == "__main__":
    main()
