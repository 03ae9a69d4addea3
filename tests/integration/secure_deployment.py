"""kipside with TLS and SASL on both sides, in front of a 3-broker cluster: the deployment of
docs/running.md ("TLS + SASL against a 3-broker cluster"), as files, commands and a demo run.

Clients log in to kipside with SCRAM-SHA-512 over TLS (kipside terminates their SASL:
--sasl-credentials, the mode in which connections of one principal share lanes and coalesced
requests; passthrough shares nothing), and kipside reaches every broker over TLS
(--upstream-ca), logged in as each client's principal's upstream user (--sasl-upstream). The
brokers are relaykit.secure's simulation: ONE Tansu presented as nodes 1, 2, 3, each behind a
TLS relay and a SASL-enforcing relay.

tests/integration/test_secure_cluster.py uses `secure_deployment()`; the demo prints every
command it runs and what it printed, for the docs:

    cd tests && ../.venv/bin/python -m integration.secure_deployment /tmp/kipside-secure
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from conftest import create_topics
from relaykit.secure import SecureCluster, secure_simulated_cluster
from relaykit.tls import CertFiles, TestCA
from testkit.kipside import KIPSIDE_BIN, Kipside, start_kipside
from testkit.ports import free_port

from kipside.protocol import api_name
from kipside.proxy import cli

from .clients import python_client_names

NODES = (1, 2, 3)
MECHANISM = "SCRAM-SHA-512"
# Who clients are to kipside (its credentials file) ...
CLIENT_PASSWORDS = {"alice": "alice-pw-Vt62", "bob": "bob-pw-Qe18"}
# ... and who kipside is to the brokers: per principal, and for its own requests (discovery).
UPSTREAM_USERS = {"User:alice": "alice-up", "User:bob": "bob-up", "User:kipside": "kipside"}
BROKER_PASSWORDS = {
    "alice-up": "alice-up-pw-Ks04",
    "bob-up": "bob-up-pw-Rn71",
    "kipside": "kp-Hy33",
}
TXN_PATTERN = "tx-*"
TXN_OUTPUT = "payments"  # the topic the transactions rule pre-registers
RULES = f"""\
coalescing:
  lanes: 1       # one lane per node and principal: batches of a principal's producers meet
  linger_ms: 5
transactions:
  - transactional_id: "{TXN_PATTERN}"
    outputs:
      - topic: {TXN_OUTPUT}
"""


@dataclass(frozen=True)
class DeploymentFiles:
    """What kipside and the clients read: certificates, credentials, logins, rules."""

    kipside_ca: Path  # clients' ssl.ca.location
    kipside: CertFiles  # --tls-cert, --tls-key
    brokers_ca: Path  # --upstream-ca
    broker: CertFiles  # every broker node's TLS listener
    credentials: Path  # --sasl-credentials
    upstream: Path  # --sasl-upstream
    rules: Path  # --rules


def _shown(command: Sequence[str], stdin: str | None = None) -> str:
    line = shlex.join(str(part) for part in command).replace(str(KIPSIDE_BIN), "kipside")
    return f"printf {shlex.quote(stdin)} | {line}" if stdin is not None else line


def add_credentials(
    credentials: Path, user: str, password: str, log: list[str], *, in_process: bool
) -> None:
    """`kipside credentials add`, as a user runs it (the password on standard input); with
    `in_process`, the same command line run by kipside.proxy.cli.main in this process (no
    interpreter to start: test_sasl_termination runs the command itself)."""
    command = [str(KIPSIDE_BIN), "credentials", "add", str(credentials), user]
    command += ["--mechanism", MECHANISM]
    if in_process:
        said = io.StringIO()
        with mock.patch("sys.stdin", io.StringIO(password + "\n")), redirect_stderr(said):
            assert cli.main(command[1:]) == 0, said.getvalue()
        output = said.getvalue()
    else:
        done = subprocess.run(
            command, input=password + "\n", text=True, capture_output=True, check=True, timeout=30
        )
        output = done.stdout + done.stderr
    log.append("$ " + _shown(command, password + "\\n"))
    log.extend(output.splitlines())


def write_files(
    folder: Path, log: list[str] | None = None, *, in_process: bool = True
) -> DeploymentFiles:
    """Every file of the deployment, in `folder` (paths under it as given: relative stays
    relative); `log` collects the commands run and what they printed (see add_credentials for
    `in_process`)."""
    log = [] if log is None else log
    folder.mkdir(parents=True, exist_ok=True)
    kipside_ca, brokers_ca = TestCA(folder, "kipside"), TestCA(folder, "brokers")
    credentials = folder / "credentials.yaml"
    for user, password in CLIENT_PASSWORDS.items():
        add_credentials(credentials, user, password, log, in_process=in_process)
    lines = ["discovery: User:kipside", "principals:"]
    for principal, user in UPSTREAM_USERS.items():
        secret = folder / f"{user}.pw"
        secret.write_text(BROKER_PASSWORDS[user] + "\n")
        secret.chmod(0o600)
        lines.append(
            f"  {principal}: {{mechanism: {MECHANISM}, username: {user}, "
            f"password_file: {secret.name}}}"
        )
    upstream = folder / "upstream.yaml"
    upstream.write_text("\n".join(lines) + "\n")
    rules = folder / "rules.yaml"
    rules.write_text(RULES)
    return DeploymentFiles(
        kipside_ca=kipside_ca.pem,
        kipside=kipside_ca.issue("kipside", "127.0.0.1", "localhost", common_name="kipside"),
        brokers_ca=brokers_ca.pem,
        broker=brokers_ca.issue("broker", "127.0.0.1", common_name="broker"),
        credentials=credentials,
        upstream=upstream,
        rules=rules,
    )


def serve_args(files: DeploymentFiles) -> list[str]:
    """kipside serve's TLS, SASL and rule options for this deployment."""
    return [
        *("--tls-cert", str(files.kipside.cert), "--tls-key", str(files.kipside.key)),
        *("--upstream-ca", str(files.brokers_ca)),
        *("--sasl-credentials", str(files.credentials), "--sasl-upstream", str(files.upstream)),
        *("--rules", str(files.rules)),
    ]


def ck_settings(files: DeploymentFiles, user: str) -> dict[str, Any]:
    """A confluent-kafka (librdkafka, kcat) client's settings, logging in as `user`."""
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(files.kipside_ca),
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": CLIENT_PASSWORDS[user],
    }


def kp_settings(files: DeploymentFiles, user: str) -> dict[str, Any]:
    """kafka-python's names for the same settings."""
    return python_client_names(ck_settings(files, user))


@dataclass
class Deployment:
    files: DeploymentFiles
    brokers: SecureCluster
    kipside: Kipside
    admin_port: int
    serve_command: list[str]

    @property
    def bootstrap(self) -> str:
        self.kipside.assert_alive()
        return self.kipside.bootstrap


@contextmanager
def secure_deployment(
    folder: Path,
    *,
    listen_port: int | None = None,
    node_port_base: int | None = None,
    log: list[str] | None = None,
    in_process: bool = True,
) -> Iterator[Deployment]:
    """The files, the secured simulated cluster, and kipside serving it; on exit kipside must
    stop with status 0 and the relays must have noted no problem."""
    files = write_files(folder, log, in_process=in_process)
    users = {user: BROKER_PASSWORDS[user] for user in UPSTREAM_USERS.values()}
    admin = free_port()
    with secure_simulated_cluster(files.broker, users, NODES) as brokers:
        args = [*serve_args(files), "--admin", f"127.0.0.1:{admin}"]
        ks = start_kipside(
            brokers,
            folder / "kipside",
            extra_args=args,
            nodes=NODES,
            listen_port=listen_port,
            node_port_base=node_port_base,
        )
        serve = ["kipside", "serve", "--upstream", brokers.bootstrap, "--listen", ks.bootstrap]
        serve += ["--node-port-base", str(min(ks.node_ports.values()) - min(NODES)), *args]
        try:
            yield Deployment(files, brokers, ks, admin, serve)
        finally:
            code = ks.stop()
            assert code == 0, f"kipside exited {code}:\n{ks.log()[-3000:]}"
            assert brokers.problems() == [], brokers.problems()


# --------------------------------------------------------------------------- the demo


def _round_trip(deployment: Deployment) -> None:
    """alice produces three records with confluent-kafka; bob reads them back."""
    import confluent_kafka as ck

    files, bootstrap = deployment.files, deployment.bootstrap
    create_topics(bootstrap, ["orders"], 6, conf=ck_settings(files, "alice"))
    print(f"# alice's producer: {{'bootstrap.servers': {bootstrap!r}, **settings}}, where")
    print(f"settings = {ck_settings(files, 'alice')!r}")
    producer = ck.Producer({"bootstrap.servers": bootstrap, **ck_settings(files, "alice")})

    def delivered(error: Any, message: Any) -> None:
        where = f"{message.topic()} [{message.partition()}] @ {message.offset()}"
        print(f"delivered {message.value().decode()} to {where}" if error is None else error)

    for value in ("order-1", "order-2", "order-3"):
        producer.produce("orders", value.encode(), partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0
    print("# bob's consumer: the same settings with bob's name and password")
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "demo", **ck_settings(files, "bob")}
    )
    consumer.assign([ck.TopicPartition("orders", 0, ck.OFFSET_BEGINNING)])
    got = 0
    while got < 3:
        message = consumer.poll(10)
        assert message is not None and message.error() is None, message
        value = (message.value() or b"").decode()
        print(f"read {value} from orders [0] @ {message.offset()}")
        got += 1
    consumer.close()


def _kcat(deployment: Deployment, user: str, mechanism: str, args: list[str]) -> None:
    """kcat (Debian's, on the system librdkafka) logging in as `user`; prints what it printed."""
    settings = {**ck_settings(deployment.files, user), "sasl.mechanism": mechanism}
    command = ["kcat", "-b", deployment.kipside.bootstrap]
    command += [f"-X{key}={value}" for key, value in settings.items()] + args
    done = subprocess.run(command, text=True, capture_output=True, timeout=30, check=False)
    print("$ " + _shown(command))
    print(done.stdout + done.stderr, end="")


def demo(folder: Path) -> None:
    """Run the deployment in `folder` and print what docs/running.md shows."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    log: list[str] = []
    ports = {"listen_port": 29092, "node_port_base": 29100}
    with secure_deployment(Path("."), **ports, log=log, in_process=False) as d:
        print("\n".join(log))
        for name in (d.files.upstream, d.files.rules):
            print(f"$ cat {name}\n{name.read_text()}", end="")
        print("$ " + shlex.join(d.serve_command))
        print(d.kipside.log(), end="")
        print(d.kipside.stdout_path.read_text(), end="")
        _round_trip(d)
        print(f"# kcat on librdkafka {_system_librdkafka()}:")
        read = ["-C", "-t", "orders", "-p", "0", "-o", "beginning", "-e", "-q"]
        _kcat(d, "bob", MECHANISM, read)
        _kcat(d, "bob", "PLAIN", read)
        print("# the brokers' SASL listeners: who logged in on each connection kipside opened")
        for node, carried in d.brokers.carried():
            apis = ", ".join(sorted(api_name(k) for k in carried.apis))
            if carried.user is None and not carried.refused and not carried.failed_logins:
                apis = "no login: ApiVersions only (Kafka answers it before authentication)"
            print(f"node {node} connection {carried.number}: {carried.user}: {apis}")


def _system_librdkafka() -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "librdkafka1"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "(unknown version)"


if __name__ == "__main__":
    demo(Path(sys.argv[1] if len(sys.argv) > 1 else "kipside-secure-demo").resolve())
