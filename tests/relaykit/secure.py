"""SIMULATION of a 3-broker cluster with SASL_SSL listeners: each node of a SimulatedCluster
behind a TLS listener and a SASL-enforcing listener, composed from the existing relays.

Tansu has neither TLS nor SASL, and is one node. Here each fake node id N of a
relaykit.cluster.SimulatedCluster gets a front of two relays on the one base, chained:

    client (kipside) --TLS--> TlsTerminatingRelay --> SaslRelay --> SimulatedNode N --> Tansu
                              (node N's address)      (logins)      (leaders, coordinators)

The cluster names the TLS relay's port as node N's address in every answer
(SimulatedCluster.advertise), so every connection to node N, from bootstrap on, passes its TLS
handshake and its SASL login before reaching the node. Each front keeps its own records: the
TLS relay its handshakes, the SASL relay who logged in on each connection and what that
connection carried (relaykit.sasl.Carried). A connection to the TLS relay is one connection to
the SASL relay, so what the SASL relay records per connection is per upstream connection of
the client (kipside's lanes and dedicated connections).

`secure_broker()` is the one-node form: a Tansu behind a TLS relay and a SASL relay, for
clients that need one secured broker rather than a cluster (the pipelines' tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from testkit.broker import start_tansu

from .base import LOOPBACK
from .cluster import SimulatedCluster, simulated_cluster
from .sasl import Carried, SaslRelay
from .tls import CertFiles, TlsTerminatingRelay


@dataclass(frozen=True)
class SecureFront:
    """Node `node_id`'s listener: TLS, then SASL, then the simulated node."""

    node_id: int
    tls: TlsTerminatingRelay
    sasl: SaslRelay


@dataclass(frozen=True)
class SecureCluster:
    """A SimulatedCluster whose every node is reached through its SecureFront."""

    cluster: SimulatedCluster
    fronts: dict[int, SecureFront]

    @property
    def bootstrap(self) -> str:
        """The nodes' TLS listeners, comma-separated (what kipside's --upstream names)."""
        return self.cluster.bootstrap

    def carried(self) -> list[tuple[int, Carried]]:
        """Every connection the SASL relays saw, as (node id, what it carried)."""
        return [(n, c) for n, front in self.fronts.items() for c in front.sasl.carried()]

    def problems(self) -> list[str]:
        found = self.cluster.problems()
        for n, front in self.fronts.items():
            found += [f"node {n} TLS front: {p}" for p in front.tls.problems()]
            found += [f"node {n} SASL front: {p}" for p in front.sasl.problems()]
        return found


@contextmanager
def secure_simulated_cluster(
    certificate: CertFiles, users: dict[str, str], node_ids: Sequence[int] = (1, 2, 3)
) -> Iterator[SecureCluster]:
    """A fresh Tansu presented as nodes `node_ids`, each behind TLS (serving `certificate`)
    and SASL (PLAIN, SCRAM-SHA-256/512 for `users`: name -> password). Everything stops on
    exit, fronts first."""
    with simulated_cluster(node_ids) as cluster, ExitStack() as fronts_open:
        fronts = {}
        for node_id in node_ids:
            sasl = SaslRelay(users, upstream=(LOOPBACK, cluster.port(node_id))).start()
            fronts_open.callback(sasl.close)
            tls = TlsTerminatingRelay(certificate, upstream=(LOOPBACK, sasl.port)).start()
            fronts_open.callback(tls.close)
            cluster.advertise(node_id, tls.port)
            fronts[node_id] = SecureFront(node_id, tls, sasl)
        yield SecureCluster(cluster, fronts)


@dataclass(frozen=True)
class SecureBroker:
    """One Tansu reached only through a TLS listener and a SASL-enforcing listener: a
    SIMULATION of one Apache Kafka broker with a SASL_SSL listener."""

    tls: TlsTerminatingRelay
    sasl: SaslRelay

    @property
    def bootstrap(self) -> str:
        """The TLS listener (what clients dial and the broker advertises)."""
        return f"{LOOPBACK}:{self.tls.port}"

    def problems(self) -> list[str]:
        return [f"TLS front: {p}" for p in self.tls.problems()] + [
            f"SASL front: {p}" for p in self.sasl.problems()
        ]


@contextmanager
def secure_broker(
    certificate: CertFiles, users: dict[str, str], client_ca: Path | None = None
) -> Iterator[SecureBroker]:
    """A fresh Tansu behind TLS (serving `certificate`; with `client_ca`, clients must present
    a certificate it signed) and SASL (PLAIN, SCRAM-SHA-256/512 for `users`), advertising the
    TLS listener so that every connection, from bootstrap on, passes both. Stops on exit."""
    with ExitStack() as stack:
        tls = TlsTerminatingRelay(certificate, client_ca=client_ca).start()
        stack.callback(tls.close)
        sasl = SaslRelay(users).start()
        stack.callback(sasl.close)
        broker = stack.enter_context(start_tansu(advertised_port=tls.port))
        sasl.upstream = (LOOPBACK, broker.port)
        tls.upstream = (LOOPBACK, sasl.port)
        yield SecureBroker(tls, sasl)
