"""TLS toward clients and toward brokers: real clients, the real broker, a TLS broker relay.

kipside serves TLS to confluent-kafka, kafka-python, aiokafka and kcat (each produces, then
reads back exactly once); speaks TLS to a TLS broker (TlsTerminatingRelay in front of Tansu,
the simulation of an SSL listener: tests/relaykit/tls.py), with SNI and the hostname check;
does both at once with mutual TLS on both sides, where a client's principal is its
certificate's subject and two principals never share an upstream connection (the relay records
the client ids each connection carried); gives new connections a replaced certificate (on a
file change and on SIGHUP) while open ones keep working; and names every mismatch in one log
line. Certificates are made at test time (trustme). Loopback only.
"""

from __future__ import annotations

import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from aiokafka.helpers import create_ssl_context
from conftest import fresh_topic, needs_kipside
from relaykit.base import LOOPBACK
from relaykit.tansu import tansu_behind
from relaykit.tls import CertFiles, TestCA, TlsTerminatingRelay
from testkit import procs, tools
from testkit.broker import Broker
from testkit.kipside import KIPSIDE_BIN, Kipside, start_kipside
from testkit.ports import free_port

from kipside.protocol import ApiKey, build_frame, encode_request_header

from .clients import Msg, assert_exactly_once_in_order, make_messages
from .clients_confluent import ck_config, ck_produce
from .clients_read_back import consume_assigned, produce_and_read_back

pytestmark = [
    pytest.mark.integration,
    needs_kipside("TLS is kipside's; no kipside here"),
]

LOG_TIMEOUT = 10.0
# The principal Kafka's default principal builder gives a client certificate (RFC 2253).
APP_A = "User:CN=app-a,OU=payments,O=kipside tests clients"
APP_B = "User:CN=app-b,OU=ledger,O=kipside tests clients"


@dataclass(frozen=True)
class Pki:
    """Every CA and certificate of this module, as files."""

    kipside_ca: Path  # what clients trust
    kipside: CertFiles  # kipside's listeners (127.0.0.1)
    clients_ca: Path  # kipside's --tls-client-ca
    app_a: CertFiles
    app_b: CertFiles
    stranger: CertFiles  # a client certificate from a CA kipside does not know
    brokers_ca: Path  # kipside's --upstream-ca
    broker: CertFiles  # the TLS relay's (broker.test, 127.0.0.1)
    kipside_upstream: CertFiles  # kipside's --upstream-cert, signed by the brokers' CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    kipside, clients, brokers = TestCA(d, "kipside"), TestCA(d, "clients"), TestCA(d, "brokers")
    return Pki(
        kipside_ca=kipside.pem,
        kipside=kipside.issue("kipside", "127.0.0.1", "localhost", common_name="kipside"),
        clients_ca=clients.pem,
        app_a=clients.issue("app-a", "app-a.test", common_name="app-a", unit="payments"),
        app_b=clients.issue("app-b", "app-b.test", common_name="app-b", unit="ledger"),
        stranger=TestCA(d, "stranger").issue("stranger", "stranger.test", common_name="stranger"),
        brokers_ca=brokers.pem,
        broker=brokers.issue("broker", "broker.test", "127.0.0.1", common_name="broker"),
        kipside_upstream=brokers.issue("kipside-up", "kipside.test", common_name="kipside"),
    )


def tls_args(pki: Pki, *, mtls: bool = False) -> list[str]:
    """`kipside serve`'s options for TLS toward clients."""
    args = ["--tls-cert", str(pki.kipside.cert), "--tls-key", str(pki.kipside.key)]
    return args + (["--tls-client-ca", str(pki.clients_ca)] if mtls else [])


def client_tls(client: str, ca: Path, cert: CertFiles | None = None) -> dict[str, Any]:
    """A client's TLS settings, in its own names (kcat takes librdkafka's)."""
    if client in ("confluent-kafka", "kcat"):
        conf = {"security.protocol": "SSL", "ssl.ca.location": str(ca)}
        if cert is not None:
            conf |= {"ssl.certificate.location": str(cert.cert), "ssl.key.location": str(cert.key)}
        return conf
    if client == "kafka-python":
        kp = {"security_protocol": "SSL", "ssl_cafile": str(ca)}
        if cert is not None:
            kp |= {"ssl_certfile": str(cert.cert), "ssl_keyfile": str(cert.key)}
        return kp
    files = {"certfile": str(cert.cert), "keyfile": str(cert.key)} if cert else {}
    return {"security_protocol": "SSL", "ssl_context": create_ssl_context(cafile=ca, **files)}


def as_broker(relay: TlsTerminatingRelay, behind: Broker) -> Broker:
    """The relay as kipside's upstream (what start_kipside dials and checks)."""
    return Broker(LOOPBACK, relay.port, behind.pid, behind.proc)


@pytest.fixture(scope="module")
def tls_kipside(
    pki: Pki, tansu: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kipside]:
    """kipside serving TLS to clients, plaintext to the suite's Tansu."""
    ks = start_kipside(tansu, tmp_path_factory.mktemp("tls-kipside"), extra_args=tls_args(pki))
    yield ks
    assert ks.stop() == 0, ks.log()


@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[tuple[TlsTerminatingRelay, Broker]]:
    """A TLS broker: the TLS relay in front of a fresh Tansu."""
    relay = TlsTerminatingRelay(pki.broker)
    with tansu_behind(relay) as broker:
        yield relay, broker
    assert relay.problems() == []


def assert_clean(ks: Kipside) -> None:
    log = ks.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


# --------------------------------------------------------------------------- clients over TLS


def kcat_round_trip(bootstrap: str, topic: str, msgs: list[Msg], conf: dict[str, Any]) -> list[Msg]:
    """Produce `msgs` (one partition, keyed) with kcat, then read the partition back."""
    kcat = tools.require("kcat")
    options = [f"-X{k}={v}" for k, v in conf.items()]
    lines = b"".join(m.key + b":" + m.value + b"\n" for m in msgs if m.key is not None)
    produce = [kcat, "-b", bootstrap, *options, "-P", "-t", topic, "-p", "0", "-K:"]
    subprocess.run(produce, input=lines, check=True, timeout=30, capture_output=True)
    consume = [kcat, "-b", bootstrap, *options, "-C", "-t", topic, "-p", "0", "-o", "beginning"]
    out = subprocess.run(
        [*consume, "-e", "-q", "-f", "%k:%s\\n"], check=True, timeout=30, capture_output=True
    ).stdout
    pairs = (line.split(b":", 1) for line in out.splitlines())
    return [Msg(0, key, value) for key, value in pairs]


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka", "kcat"])
def test_clients_produce_and_consume_over_tls(
    client: str, pki: Pki, tansu: Broker, tls_kipside: Kipside, request: pytest.FixtureRequest
) -> None:
    """Each client produces over TLS to kipside and reads everything back over TLS, exactly
    once and in order; kipside logs no error."""
    partitions = 1 if client == "kcat" else 3
    topic = fresh_topic(tansu.bootstrap, "tls", partitions, request)
    msgs = make_messages(40, partitions, tag=client, headers=client != "kcat")
    conf = client_tls(client, pki.kipside_ca)
    bootstrap = tls_kipside.bootstrap
    if client == "kcat":
        got = kcat_round_trip(bootstrap, topic, msgs, conf)
        assert_exactly_once_in_order(msgs, got)
    else:
        found = produce_and_read_back(client, bootstrap, topic, msgs, partitions, conf)
        assert_exactly_once_in_order(msgs, *found)
    assert_clean(tls_kipside)


# --------------------------------------------------------------------------- toward brokers


def test_tls_toward_brokers(
    pki: Pki,
    tls_broker: tuple[TlsTerminatingRelay, Broker],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Plaintext clients, kipside -> TLS -> a TLS broker: discovery, lanes and the clients' own
    connections all speak TLS, each sends --upstream-server-name as SNI and checks the broker's
    certificate against it; records arrive exactly once."""
    relay, broker = tls_broker
    name = ["--upstream-ca", str(pki.brokers_ca), "--upstream-server-name", "broker.test"]
    seen = len(relay.handshakes())
    ks = start_kipside(as_broker(relay, broker), tmp_path, extra_args=name)
    try:
        topic = fresh_topic(ks.bootstrap, "tls-up", 3, request)
        msgs = make_messages(300, 3, tag="up")
        ck_produce(ks.bootstrap, topic, msgs)
        assert_exactly_once_in_order(msgs, *consume_assigned(ks.bootstrap, topic, 3, len(msgs)))
        handshakes = relay.handshakes()[seen:]
        assert len(handshakes) >= 3  # discovery, lanes, the clients' own connections
        assert {(h.server_name, h.error) for h in handshakes} == {("broker.test", None)}
        assert_clean(ks)
    finally:
        assert ks.stop() == 0


@pytest.fixture(scope="module")
def mtls_broker(pki: Pki) -> Iterator[tuple[TlsTerminatingRelay, Broker]]:
    """A TLS broker that requires a client certificate signed by the brokers' CA."""
    relay = TlsTerminatingRelay(pki.broker, client_ca=pki.brokers_ca)
    with tansu_behind(relay) as broker:
        yield relay, broker
    assert relay.problems() == []


def produce_as(bootstrap: str, topic: str, msgs: list[Msg], conf: dict[str, Any]) -> None:
    ck_produce(bootstrap, topic, msgs, conf={"linger.ms": 20, **conf})


def test_mtls_both_ways_principals_never_share_a_connection(
    pki: Pki,
    mtls_broker: tuple[TlsTerminatingRelay, Broker],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """TLS on both sides, mutual on both: two clients with certificates of two principals
    produce at once to one topic. Each is known by its certificate subject as Kafka writes it,
    kipside opens separate lanes for each, and no upstream connection (as the TLS broker saw
    them) carried requests of both; kipside presents its own client certificate upstream."""
    relay, broker = mtls_broker
    upstream = ["--upstream-ca", str(pki.brokers_ca)]
    upstream += ["--upstream-cert", str(pki.kipside_upstream.cert)]
    upstream += ["--upstream-key", str(pki.kipside_upstream.key)]
    args = tls_args(pki, mtls=True) + upstream
    ks = start_kipside(as_broker(relay, broker), tmp_path, extra_args=args)
    try:
        conf = {
            who: client_tls("confluent-kafka", pki.kipside_ca, cert) | {"client.id": f"tls-{who}"}
            for who, cert in (("app-a", pki.app_a), ("app-b", pki.app_b))
        }
        topic = fresh_topic(ks.bootstrap, "mtls", 3, request, conf=conf["app-a"])
        sent = {who: make_messages(200, 3, tag=who) for who in conf}
        with ThreadPoolExecutor(2) as both:
            done = [both.submit(produce_as, ks.bootstrap, topic, sent[w], conf[w]) for w in conf]
            for future in done:
                future.result(timeout=60)
        got, _ = consume_assigned(ks.bootstrap, topic, 3, 400, conf=conf["app-b"])
        for who, msgs in sent.items():
            assert_exactly_once_in_order(msgs, [m for m in got if m.value.startswith(who.encode())])

        carried = relay.client_ids()
        assert not [n for n, ids in carried.items() if {"tls-app-a", "tls-app-b"} <= ids], carried
        for who in conf:
            assert any(f"tls-{who}" in ids for ids in carried.values()), (who, carried)
        lanes = [ln for ln in ks.log().splitlines() if "kipside.lanes" in ln and " open" in ln]
        for principal in (APP_A, APP_B):
            assert any(f"for {principal} open" in ln for ln in lanes), (principal, lanes)
        subjects = {h.client_subject for h in relay.handshakes()}
        names = [("organizationName", "kipside tests brokers")]
        names += [("organizationalUnitName", "test"), ("commonName", "kipside")]
        assert subjects == {tuple((name,) for name in names)}, subjects
        assert_clean(ks)
    finally:
        assert ks.stop() == 0


def handshake(port: int, ca: Path, cert: CertFiles | None) -> tuple[ssl.SSLSocket, int]:
    """A TLS connection to kipside on `port` (our local port too, to find kipside's log line);
    with TLS 1.3 the client's handshake ends before kipside has checked its certificate."""
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    raw = socket.create_connection((LOOPBACK, port), timeout=5)
    peer = raw.getsockname()[1]
    return context.wrap_socket(raw, server_hostname=LOOPBACK), peer


def one_line_about(ks: Kipside, mark: int, peer: int) -> str:
    """The one log line kipside wrote after `mark` about client port `peer`."""
    mine = re.compile(rf"127\.0\.0\.1:{peer}\b")
    assert ks.wait_for_log(mine.search, mark, LOG_TIMEOUT), ks.log_since(mark)
    time.sleep(0.2)  # then count: one line, not one per read or retry
    lines = [ln for ln in ks.log_since(mark).splitlines() if mine.search(ln)]
    assert len(lines) == 1, lines
    return lines[0]


def test_mtls_refuses_clients_without_a_valid_certificate(
    pki: Pki, tansu: Broker, tmp_path: Path
) -> None:
    """Under mTLS a client with no certificate, or one from a CA kipside does not trust, is
    refused: the client gets the TLS alert that says why, and kipside's log line names the
    client, the listener and the fix."""
    ks = start_kipside(tansu, tmp_path, extra_args=tls_args(pki, mtls=True))
    try:
        listener = f"the TLS listener 127.0.0.1:{ks.port}"
        for cert, says, alert in (
            (None, "it sent no client certificate, and --tls-client-ca", "CERTIFICATE_REQUIRED"),
            (pki.stranger, "its certificate did not verify against --tls-client-ca", "UNKNOWN_CA"),
        ):
            mark = ks.log_mark()
            sock, peer = handshake(ks.port, pki.kipside_ca, cert)
            with sock:
                with pytest.raises(ssl.SSLError, match=alert):
                    sock.recv(1)  # TLS 1.3: the client learns it at its first read
                line = one_line_about(ks, mark, peer)
            assert f"client 127.0.0.1:{peer} refused on {listener}: {says}" in line, line
            assert str(pki.clients_ca) in line, line
        sock, _ = handshake(ks.port, pki.kipside_ca, pki.app_a)
        with sock:  # a valid certificate is served: ApiVersions answered
            request = encode_request_header(ApiKey.API_VERSIONS, 0, 7, "mtls-check")
            sock.sendall(build_frame(request, b""))
            assert len(sock.recv(65536)) > 8
    finally:
        assert ks.stop() == 0


# --------------------------------------------------------------------------- reload


def served_certificate(port: int, ca: Path) -> bytes:
    sock, _ = handshake(port, ca, None)
    with sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def pem_der(files: CertFiles) -> bytes:
    return ssl.PEM_cert_to_DER_cert(files.cert.read_text())


def test_certificates_reload_without_a_restart(
    pki: Pki, tansu: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Replaced certificate files reach new connections, on a file change and on SIGHUP; an
    open connection keeps working throughout; unusable files are logged and the certificate in
    force stays."""
    ca = TestCA(tmp_path, "rotating")
    first = ca.issue("kipside", "127.0.0.1", common_name="kipside-1")
    args = ["--tls-cert", str(first.cert), "--tls-key", str(first.key)]
    ks = start_kipside(tansu, tmp_path / "ks", extra_args=args)
    try:
        assert served_certificate(ks.port, ca.pem) == pem_der(first)
        topic = fresh_topic(tansu.bootstrap, "rotate", 1, request)
        producer = ck.Producer(ck_config(ks.bootstrap, **client_tls("confluent-kafka", ca.pem)))
        msgs = make_messages(60, 1, tag="rot")
        ck_produce(ks.bootstrap, topic, msgs[:20], producer=producer)

        mark = ks.log_mark()
        second = ca.issue("kipside", "127.0.0.1", common_name="kipside-2")  # same files
        assert ks.wait_for_log(lambda ln: "reloaded (file change)" in ln, mark, LOG_TIMEOUT)
        assert served_certificate(ks.port, ca.pem) == pem_der(second)
        ck_produce(ks.bootstrap, topic, msgs[20:40], producer=producer)  # the open connection

        mark = ks.log_mark()
        first.key.write_text("not a key\n")
        assert ks.wait_for_log(lambda ln: "reload (file change) rejected" in ln, mark, LOG_TIMEOUT)
        assert served_certificate(ks.port, ca.pem) == pem_der(second)

        mark = ks.log_mark()
        third = ca.issue("kipside", "127.0.0.1", common_name="kipside-3")
        ks.proc.send_signal(signal.SIGHUP)
        assert ks.wait_for_log(lambda ln: "reloaded (SIGHUP)" in ln, mark, LOG_TIMEOUT)
        assert served_certificate(ks.port, ca.pem) == pem_der(third)
        assert "CN=kipside-3" in ks.log_since(mark)
        ck_produce(ks.bootstrap, topic, msgs[40:], producer=producer)
        got = consume_assigned(
            ks.bootstrap, topic, 1, 60, conf=client_tls("confluent-kafka", ca.pem)
        )
        assert_exactly_once_in_order(msgs, *got)
    finally:
        assert ks.stop() == 0


# --------------------------------------------------------------------------- mismatches


def test_plaintext_client_on_the_tls_listener(tls_kipside: Kipside) -> None:
    mark = tls_kipside.log_mark()
    with socket.create_connection((LOOPBACK, tls_kipside.port), timeout=5) as sock:
        peer = sock.getsockname()[1]
        sock.sendall(build_frame(encode_request_header(ApiKey.API_VERSIONS, 3, 1, "plain"), b""))
        assert sock.recv(100) == b""  # closed
    line = one_line_about(tls_kipside, mark, peer)
    assert (
        f"client 127.0.0.1:{peer} sent plaintext Kafka (an ApiVersions v3 request) to the TLS "
        f"listener 127.0.0.1:{tls_kipside.port}; configure the client with security.protocol=SSL"
    ) in line, line


def test_tls_client_on_a_plaintext_listener(kipside: Kipside, pki: Pki) -> None:
    mark = kipside.log_mark()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(kipside.port, pki.kipside_ca, None)
    line = " ".join(kipside.wait_for_log(lambda ln: "TLS ClientHello" in ln, mark, LOG_TIMEOUT))
    assert (
        "received a TLS ClientHello on a plaintext Kafka port; this listener is plaintext: set "
        "the client's security.protocol=PLAINTEXT, or start kipside with --tls-cert FILE "
        "--tls-key FILE"
    ) in line, line


def first_bootstrap_problem(upstream: str, args: list[str], tmp_path: Path) -> str:
    """Start `kipside serve` toward `upstream` and return its first warning about reaching
    the bootstrap broker (then stop it: it would retry for 30 s)."""
    listen = f"{LOOPBACK}:{free_port()}"
    command = [str(KIPSIDE_BIN), "serve", "--upstream", upstream, "--listen", listen, *args]
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "kipside.log"
    with log.open("wb") as err:
        proc = procs.track(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err))
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            lines = [ln for ln in log.read_text().splitlines() if "upstream bootstrap" in ln]
            if lines:
                return lines[0]
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no bootstrap warning in 15 s:\n{log.read_text()}")
    finally:
        procs.stop(proc)


def test_upstream_mismatches_are_named(
    pki: Pki, tansu: Broker, tls_broker: tuple[TlsTerminatingRelay, Broker], tmp_path: Path
) -> None:
    """TLS toward a plaintext broker, plaintext toward a TLS broker, a broker certificate for
    another name, a broker certificate from another CA: one warning each, saying which."""
    relay = f"{LOOPBACK}:{tls_broker[0].port}"
    ca = ["--upstream-ca", str(pki.brokers_ca)]
    tls_to_plaintext = (
        "no TLS handshake completed within 4.5 s; is it a plaintext listener? --upstream-ca "
        "turns TLS on toward every broker"
    )
    plaintext_to_tls = (
        "closed the connection at a plaintext Kafka request and answers a TLS handshake; its "
        "listener uses TLS: start kipside with --upstream-ca FILE"
    )
    wrong_name = (
        "the broker's certificate did not verify: Hostname mismatch, certificate is not valid "
        "for 'wrong.test'. (checked against --upstream-server-name wrong.test, CA file "
        f"--upstream-ca {pki.brokers_ca})"
    )
    wrong_ca = (
        "the broker's certificate did not verify: unable to get local issuer certificate "
        f"(checked against the host 127.0.0.1, CA file --upstream-ca {pki.kipside_ca})"
    )
    cases = [
        # Tansu waits for the rest of the 369 MB "frame" a ClientHello's first bytes announce
        # (Apache Kafka closes at once: "closed the connection during the TLS handshake").
        (tansu.bootstrap, ca, tls_to_plaintext),
        (relay, [], plaintext_to_tls),
        (relay, [*ca, "--upstream-server-name", "wrong.test"], wrong_name),
        (relay, ["--upstream-ca", str(pki.kipside_ca)], wrong_ca),
    ]
    for i, (upstream, args, says) in enumerate(cases):
        line = first_bootstrap_problem(upstream, args, tmp_path / str(i))
        assert f"upstream bootstrap {upstream}: " in line and says in line, (says, line)


def test_unusable_certificate_files_stop_startup(pki: Pki, tmp_path: Path) -> None:
    """A key that is not the certificate's, or a missing file: exit status 2, one line naming
    the option and the file."""
    base = [str(KIPSIDE_BIN), "serve", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0"]
    wrong_key = ["--tls-cert", str(pki.kipside.cert), "--tls-key", str(pki.broker.key)]
    missing = ["--upstream-ca", str(tmp_path / "nope.pem")]
    for args, says in (
        (wrong_key, f"--tls-key {pki.broker.key} is not the private key of the certificate in "),
        (missing, f"cannot read --upstream-ca {tmp_path / 'nope.pem'}: No such file"),
    ):
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=20)
        assert done.returncode == 2, done.stderr
        assert f"kipside: error: {says}" in done.stderr, done.stderr
