"""The pipelines' TLS and SASL settings, read from Kafka's client config names: property files,
JAAS entries, and the errors a mistake gets (naming the setting, never a secret's value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from relaykit.tls import TestCA

from kipside.pipeline.kafka.properties import PropertiesError, load_properties
from kipside.pipeline.kafka.security import SecurityConfigError, parse_jaas, parse_security
from kipside.pipeline.source.options import OptionError, parse_source_options

SECRET = "s3cret-Pw;x"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def _name(key: str) -> str:
    return f"option kafka.{key}"


def test_jaas_entries_as_kafka_writes_them() -> None:
    quoted = 'a;"b\\'  # a password with a semicolon, a double quote and a backslash
    escaped = quoted.replace("\\", "\\\\").replace('"', '\\"')
    assert parse_jaas(f'{SCRAM} required username="alice" password="{escaped}";', "x") == (
        "alice",
        quoted,
    )
    assert parse_jaas(f"{PLAIN} required\n  username=bob\n  password=pw ;", "x") == ("bob", "pw")


@pytest.mark.parametrize(
    ("jaas", "says"),
    [
        (f'{SCRAM} required username="alice" password="{SECRET}"', "ends with ';'"),
        (f'{SCRAM} required username="alice";', "needs password"),
        (f'com.example.Kerberos required password="{SECRET}";', "com.example.Kerberos"),
        (f'{SCRAM} username="alice" password="{SECRET}";', "its flag, `required`"),
    ],
)
def test_a_bad_jaas_entry_is_named_but_never_quoted(jaas: str, says: str) -> None:
    with pytest.raises(SecurityConfigError) as failure:
        parse_jaas(jaas, "option kafka.sasl.jaas.config")
    text = str(failure.value)
    assert says in text and "option kafka.sasl.jaas.config" in text, text
    assert "s3cret" not in text


def test_protocols_and_what_they_need() -> None:
    assert parse_security({}, _name).describe() == "plaintext"
    jaas = f'{SCRAM} required username="alice" password="{SECRET}";'
    sasl = parse_security(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": jaas,
        },
        _name,
    )
    assert sasl.describe() == "SASL SCRAM-SHA-256 as 'alice'"
    assert "s3cret" not in repr(sasl)
    with pytest.raises(SecurityConfigError, match="GSSAPI"):
        parse_security({"security.protocol": "SASL_SSL", "sasl.jaas.config": jaas}, _name)
    with pytest.raises(SecurityConfigError, match=r"security\.protocol is PLAINTEXT"):
        parse_security({"sasl.mechanism": "PLAIN"}, _name)
    with pytest.raises(SecurityConfigError, match="must be one of"):
        parse_security({"security.protocol": "TLS"}, _name)


def test_only_pem_stores_are_read(tmp_path: Path) -> None:
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed not pem")
    with pytest.raises(SecurityConfigError, match="JKS"):
        parse_security({"security.protocol": "SSL", "ssl.truststore.type": "JKS"}, _name)
    with pytest.raises(SecurityConfigError, match="not a PEM file"):
        parse_security({"security.protocol": "SSL", "ssl.truststore.location": str(jks)}, _name)
    with pytest.raises(SecurityConfigError, match="cannot read"):
        parse_security(
            {"security.protocol": "SSL", "ssl.truststore.location": str(tmp_path / "none")},
            _name,
        )


def test_a_property_file_in_java_syntax(tmp_path: Path) -> None:
    ca = TestCA(tmp_path, "props")
    client = ca.issue("client", "client")
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes(client.key.read_bytes() + client.cert.read_bytes())
    path = tmp_path / "client.properties"
    path.write_text(
        "# the cluster\n"
        "bootstrap.servers=127.0.0.1:9093\n"
        "security.protocol : SASL_SSL\n"
        "sasl.mechanism SCRAM-SHA-512\n"
        f"sasl.jaas.config={SCRAM} required \\\n"
        f'    username="alice" password="pw\\u0031";\n'
        "! PEM stores\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca.pem}\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={keystore}\n"
    )
    props = load_properties(str(path))
    assert props.bootstrap == "127.0.0.1:9093"
    security = props.security()
    assert security.sasl is not None and security.sasl.password == "pw1"
    assert security.tls is not None and security.tls.keystore_location == str(keystore)
    assert "pw1" not in repr(props) and "sasl.jaas.config" in repr(props)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("security.protocol=SSL\nssl.trustore.location=/x\n", ":2: ssl.trustore.location is not"),
        ("acks=all\n", "client.properties:1: acks is not a setting kipside reads"),
        ("client.id=a\nclient.id=b\n", ":2: client.id is set twice (also on line 1)"),
        (f"sasl.jaas.config={SCRAM} required password=s3cret;\n", "security.protocol is PLAINTEXT"),
    ],
)
def test_a_bad_property_file_names_file_and_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "client.properties"
    path.write_text(text)
    with pytest.raises(PropertiesError) as failure:
        load_properties(str(path))
    assert says in str(failure.value), str(failure.value)
    assert "s3cret" not in str(failure.value)


def test_the_source_takes_sparks_kafka_option_names() -> None:
    jaas = f'{PLAIN} required username="alice" password="{SECRET}";'
    options = parse_source_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "t",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": jaas,
        },
        streaming=False,
    )
    assert options.client.security.describe() == "SASL PLAIN as 'alice'"
    assert "s3cret" not in repr(options)
    with pytest.raises(OptionError, match=r"option kafka\.sasl\.mechanism: 'OAUTHBEARER'"):
        parse_source_options(
            {
                "kafka.bootstrap.servers": "127.0.0.1:9092",
                "subscribe": "t",
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "OAUTHBEARER",
            },
            streaming=False,
        )


def test_sparks_redaction_hides_every_secret_setting() -> None:
    """Spark hides an option's value in its UI and event log when the option's name or value
    matches spark.redaction.regex; kipside's sessions name every secret Kafka setting there,
    so a private key given inline is hidden too, not only values that say "password"."""
    import re

    from kipside.pipeline.kafka.security import SECRET_CONFIGS
    from kipside.pipeline.spark import REDACTION_REGEX

    redacts = re.compile(REDACTION_REGEX.removeprefix("(?i)"), re.IGNORECASE)
    for name in SECRET_CONFIGS:
        for option in (f"kafka.{name}", f"source.kafka.{name}"):
            assert redacts.search(option), option
    assert not redacts.search("kafka.ssl.truststore.location")
