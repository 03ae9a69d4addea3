"""The pipelines against clusters that require TLS and SASL, with Spark's and Kafka's names.

Tansu has neither, so each cluster here is a SIMULATION composed from the test relays in front
of a real Tansu: the source is one broker behind a TLS listener that requires a client
certificate (mTLS) and a SASL listener (SCRAM-SHA-512); the destination is three brokers, each
behind TLS and SASL (SCRAM-SHA-256). Records are written and read back with confluent-kafka
over the same listeners.

- `kipside mirror` with --source-config/--dest-config property files copies a topic, every
  connection logged in as the file's user, and no secret appears in its output, Spark's log,
  the checkpoint or Spark's event log (what Spark's UI shows); `mirror translate` reads both
  clusters with the same files.
- `format("kipside")` reads the source with Spark's Kafka option names.
- `kipside lake` ingests from it, with no secret in its checkpoint or its own files.
- A wrong password, or a broker certificate no trusted CA signed, is one error line, at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import create_topics, unique_name
from relaykit.secure import SecureBroker, SecureCluster, secure_broker, secure_simulated_cluster
from relaykit.tls import TestCA
from testkit.produce import send_all

from .conftest import run_cli

pytestmark = [pytest.mark.integration]

SOURCE_USER, SOURCE_PASSWORD = "mirror-src", "src-Pw-7Qz-secret"
DEST_USER, DEST_PASSWORD = "mirror-dst", "dst-Pw-4Lm-secret"
SECRETS = (SOURCE_PASSWORD, DEST_PASSWORD)
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PARTITIONS = 3
RECORDS = 300


@dataclass(frozen=True)
class Secured:
    source: SecureBroker
    dest: SecureCluster
    tmp: Path
    ca: Path
    keystore: Path
    topic: str
    sent: dict[int, list[bytes]]

    def jaas(self, user: str, password: str) -> str:
        return f'{SCRAM} required username="{user}" password="{password}";'

    def source_settings(self, password: str = SOURCE_PASSWORD) -> dict[str, str]:
        """The source's settings, Kafka's client config names."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": self.jaas(SOURCE_USER, password),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
        }

    def dest_settings(self, password: str = DEST_PASSWORD) -> dict[str, str]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": self.jaas(DEST_USER, password),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    def properties(self, name: str, settings: dict[str, str], bootstrap: str) -> Path:
        path = self.tmp / name
        lines = [f"bootstrap.servers={bootstrap}"] + [f"{k}={v}" for k, v in settings.items()]
        path.write_text("\n".join(lines) + "\n")
        return path


def _librdkafka(settings: dict[str, str], bootstrap: str, **extra: Any) -> dict[str, Any]:
    """The same login for confluent-kafka (librdkafka's names)."""
    user, password = re.findall(r'"([^"]*)"', settings["sasl.jaas.config"])
    config = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": settings["sasl.mechanism"],
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": settings["ssl.truststore.location"],
        **extra,
    }
    if "ssl.keystore.location" in settings:
        config["ssl.certificate.location"] = settings["ssl.keystore.location"]
        config["ssl.key.location"] = settings["ssl.keystore.location"]
    return config


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secure")
    brokers_ca = TestCA(tmp, "brokers")
    clients_ca = TestCA(tmp, "clients")
    certificate = brokers_ca.issue("broker", "127.0.0.1")
    client = clients_ca.issue("mirror", "mirror", common_name="kipside-mirror")
    keystore = tmp / "mirror-keystore.pem"
    keystore.write_bytes(client.key.read_bytes() + client.cert.read_bytes())
    with (
        secure_broker(certificate, {SOURCE_USER: SOURCE_PASSWORD}, clients_ca.pem) as source,
        secure_simulated_cluster(certificate, {DEST_USER: DEST_PASSWORD}) as dest,
    ):
        topic = unique_name("secure")
        partial = Secured(source, dest, tmp, brokers_ca.pem, keystore, topic, {})
        settings = _librdkafka(partial.source_settings(), source.bootstrap)
        create_topics(source.bootstrap, [topic], PARTITIONS, conf=settings)
        producer = ck.Producer({**settings, "linger.ms": 5, "compression.type": "zstd"})
        errors: list[str] = []
        sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        records = []
        for n in range(RECORDS):
            value = json.dumps({"n": n}).encode()
            sent[n % PARTITIONS].append(value)
            records.append({"value": value, "partition": n % PARTITIONS})
        send_all(producer, topic, records, errors)
        assert producer.flush(30) == 0 and not errors, errors[:3]
        (tmp / "n.ddl").write_text("n BIGINT")  # the lake's schema: the values are {"n": N}
        yield Secured(source, dest, tmp, brokers_ca.pem, keystore, topic, sent)
        assert not source.problems() and not dest.problems()


def _read_dest(secured: Secured, topic: str) -> dict[int, list[bytes]]:
    settings = _librdkafka(secured.dest_settings(), secured.dest.bootstrap)
    consumer = ck.Consumer(
        {**settings, "group.id": unique_name("check"), "enable.auto.commit": False}
    )
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        idle = 0
        while sum(len(v) for v in got.values()) < RECORDS and idle < 40:
            message = consumer.poll(0.5)
            if message is None:
                idle += 1
            elif message.error() is None:
                got[int(message.partition() or 0)].append(bytes(message.value() or b""))
    finally:
        consumer.close()
    return got


def _files_text(*folders: Path) -> str:
    text = []
    for folder in folders:
        paths = [folder] if folder.is_file() else sorted(folder.rglob("*"))
        text += [p.read_bytes().decode("utf-8", "replace") for p in paths if p.is_file()]
    return "\n".join(text)


@pytest.mark.spark
def test_the_mirror_copies_between_secured_clusters_and_shows_no_secret(
    secured: Secured,
) -> None:
    source = secured.properties(
        "source.properties", secured.source_settings(), secured.source.bootstrap
    )
    dest = secured.properties("dest.properties", secured.dest_settings(), secured.dest.bootstrap)
    checkpoint, events = secured.tmp / "ck", secured.tmp / "events"
    events.mkdir()
    run = run_cli(
        "mirror",
        *("--source-config", str(source), "--dest-config", str(dest)),
        *("--topics", re.escape(secured.topic), "--rename", "sec.", "--once"),
        *("--checkpoint", str(checkpoint)),
        *("--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events}"),
        *("--conf", "spark.eventLog.compress=false"),
        timeout=300,
    )
    assert run.code == 0, run.explain()
    assert _read_dest(secured, "sec." + secured.topic) == secured.sent

    logins = {c.user for c in secured.source.sasl.authenticated()}
    logins |= {c.user for _, c in secured.dest.carried() if c.user is not None}
    assert logins == {SOURCE_USER, DEST_USER}
    assert not any(c.failed_logins for c in secured.source.sasl.carried())
    subjects = [h.client_subject for h in secured.source.tls.handshakes() if h.error is None]
    assert subjects and all(
        ("commonName", "kipside-mirror") in {kv for rdn in s or () for kv in rdn} for s in subjects
    ), subjects

    translate = run_cli(
        "mirror",
        "translate",
        *("--source-config", str(source), "--dest-config", str(dest)),
        *("--group", "no-such-group"),
        timeout=60,
    )
    assert translate.code == 1 and "group 'no-such-group' has no committed offsets" in (
        translate.stderr
    ), translate.explain()

    shown = [run.stdout, run.stderr, translate.stderr]
    shown.append(_files_text(checkpoint, Path(f"{checkpoint}.spark.log"), events))
    assert len(shown[-1]) > 10_000, "Spark's event log and the checkpoint were read"
    for secret in SECRETS:
        assert not any(secret in text for text in shown), f"a password leaked: {secret}"


@pytest.mark.spark
def test_format_kipside_reads_a_secured_cluster_with_sparks_option_names(
    spark: Any, spark_log: Path, secured: Secured
) -> None:
    options = {f"kafka.{k}": v for k, v in secured.source_settings().items()}
    options |= {"kafka.bootstrap.servers": secured.source.bootstrap, "subscribe": secured.topic}
    frame = spark.read.format("kipside").options(**options).load()
    rows = frame.collect()
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        got[row.partition].append(bytes(row.value))
    assert got == secured.sent
    # Neither the session's log nor the query's plan (what Spark's UI shows) holds a password.
    shown = [spark_log.read_text(errors="replace"), frame._jdf.queryExecution().toString()]
    assert shown[1], "the plan was read"
    for secret in SECRETS:
        assert not any(secret in text for text in shown), f"a password leaked: {secret}"


@pytest.mark.spark
def test_the_lake_ingests_from_a_secured_cluster(spark: Any, secured: Secured) -> None:
    from pyspark.sql.types import StructType

    from kipside.pipeline.kafka.properties import load_properties
    from kipside.pipeline.lake.job import LakeJob, _Written, start_query
    from kipside.pipeline.lake.schema import load_schema

    schema_file = secured.tmp / "n.ddl"
    props = secured.properties("lake.properties", secured.source_settings(), "unused:1")
    job = LakeJob(
        bootstrap=secured.source.bootstrap,
        topics=re.escape(secured.topic),
        schema=str(schema_file),
        out=str(secured.tmp / "lake"),
        checkpoint=str(secured.tmp / "lake-ck"),
        once=True,
        source_config=load_properties(str(props)),
    )
    query = start_query(spark, job, load_schema(job.schema, StructType.fromDDL), _Written())
    assert query.awaitTermination(180)
    rows = spark.read.parquet(job.out).select("n").collect()
    assert sorted(r.n for r in rows) == list(range(RECORDS))
    kept = _files_text(Path(job.checkpoint), Path(job.out) / "_kipside")
    assert kept and not any(secret in kept for secret in SECRETS), "a password leaked"


def _one_error(stderr: str, command: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith(f"kipside {command}: error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_wrong_password_is_one_line_at_once(secured: Secured) -> None:
    wrong = "wrong-Pw-9Xc"
    source = secured.properties(
        "src-ok.properties", secured.source_settings(), secured.source.bootstrap
    )
    dest = secured.properties(
        "dst-wrong.properties", secured.dest_settings(wrong), secured.dest.bootstrap
    )
    run = run_cli(
        "mirror",
        *("--source-config", str(source), "--dest-config", str(dest)),
        *("--topics", re.escape(secured.topic), "--checkpoint", str(secured.tmp / "ck-wrong")),
        timeout=60,
    )
    assert run.code == 1, run.explain()
    line = _one_error(run.stderr, "mirror")
    assert f"as '{DEST_USER}' (SCRAM-SHA-256) failed" in line, line
    assert "SASL_AUTHENTICATION_FAILED" in line and f"sasl.jaas.config of {dest}" in line, line
    assert wrong not in run.stderr and run.seconds < 30, run.explain()

    wrong_source = secured.properties(
        "lake-wrong.properties", secured.source_settings(wrong), secured.source.bootstrap
    )
    lake = run_cli(
        "lake",
        *("--source-config", str(wrong_source)),
        *("--topics", re.escape(secured.topic), "--schema", str(secured.tmp / "n.ddl")),
        *("--out", str(secured.tmp / "no-lake"), "--checkpoint", str(secured.tmp / "no-ck")),
        timeout=60,
    )
    assert lake.code == 1, lake.explain()
    assert f"as '{SOURCE_USER}' (SCRAM-SHA-512) failed" in _one_error(lake.stderr, "lake")
    assert wrong not in lake.stderr


def test_a_certificate_no_trusted_ca_signed_is_one_line_at_once(secured: Secured) -> None:
    other = TestCA(secured.tmp, "other")
    settings = secured.dest_settings() | {"ssl.truststore.location": str(other.pem)}
    dest = secured.properties("dst-ca.properties", settings, secured.dest.bootstrap)
    source = secured.properties(
        "src-ca.properties", secured.source_settings(), secured.source.bootstrap
    )
    run = run_cli(
        "mirror",
        *("--source-config", str(source), "--dest-config", str(dest)),
        *("--topics", re.escape(secured.topic), "--checkpoint", str(secured.tmp / "ck-ca")),
        timeout=60,
    )
    assert run.code == 1, run.explain()
    line = _one_error(run.stderr, "mirror")
    assert "its certificate is refused" in line and "ssl.truststore.location" in line, line
