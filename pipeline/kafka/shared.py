"""One Kafka client per cluster per process, reused across Spark tasks.

Spark reuses a Python worker for many tasks (spark.python.worker.reuse), so a task can find the
connections the previous one opened instead of dialling, negotiating versions and reading
metadata again. A client that failed is dropped, never handed out again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kipside.protocol import Address

from .client import ClientConfig, KafkaClient

__all__ = ["drop_client", "shared_client"]

_clients: dict[tuple[tuple[Address, ...], str, ClientConfig], KafkaClient] = {}


def shared_client(bootstrap: Sequence[Address], role: str, config: ClientConfig) -> KafkaClient:
    key = (tuple(bootstrap), role, config)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = KafkaClient(bootstrap, role=role, config=config)
    return client


def drop_client(client: KafkaClient) -> None:
    """Close a client after a failure; the next task gets a fresh one."""
    client.close()
    for key, known in list(_clients.items()):
        if known is client:
            del _clients[key]
