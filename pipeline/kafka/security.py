"""Who the pipelines' Kafka client is to a cluster: TLS and SASL, read from Kafka's client configs.

The settings keep the names of Kafka's client configs (what Spark's Kafka source takes with a
`kafka.` prefix, and what a Kafka tool's property file holds): security.protocol (PLAINTEXT,
SSL, SASL_PLAINTEXT, SASL_SSL), sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
sasl.jaas.config (PlainLoginModule or ScramLoginModule with username and password), and the
PEM forms of the TLS stores: ssl.truststore.type=PEM with ssl.truststore.location or
ssl.truststore.certificates, ssl.keystore.type=PEM with ssl.keystore.location (key and chain in
one file) or ssl.keystore.key and ssl.keystore.certificate.chain, ssl.key.password, and
ssl.endpoint.identification.algorithm (https, the default, checks the broker's name against its
certificate; empty turns that off).

What it must never do: put a secret (the JAAS text, a password, a private key) in a message, a
repr or a log line. Errors name the setting, never its value. It builds `ssl.SSLContext`s and
checks settings; dialling and logging in are pipeline.kafka.connection's and .login's.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from kipside.protocol import SASL_MECHANISMS

__all__ = [
    "PLAINTEXT",
    "SECRET_CONFIGS",
    "SECURITY_CONFIGS",
    "SaslSettings",
    "Security",
    "SecurityConfigError",
    "TlsSettings",
    "parse_security",
    "tls_context",
]

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SECURITY_CONFIGS: Final = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.jaas.config",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.certificates",
        "ssl.truststore.password",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
)
SECRET_CONFIGS: Final = frozenset(
    {
        "sasl.jaas.config",
        "ssl.keystore.key",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
    }
)
"""Settings whose values are never shown (Spark's redaction is told about them too)."""
_LOGIN_MODULES: Final = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# key=value options of a JAAS entry: values unquoted or in double quotes (backslash escapes).
_JAAS_OPTION: Final = re.compile(r'\s*([\w.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


class SecurityConfigError(ValueError):
    """A TLS or SASL setting is missing, unknown or can't be used; the message names it (never
    its value)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """PEM trust and client certificate (ssl.* configs)."""

    truststore_location: str | None = None
    truststore_certificates: str | None = field(default=None, repr=False)
    keystore_location: str | None = None
    keystore_chain: str | None = field(default=None, repr=False)
    keystore_key: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class SaslSettings:
    mechanism: str
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Security:
    protocol: str = "PLAINTEXT"
    tls: TlsSettings | None = None
    sasl: SaslSettings | None = None

    def describe(self) -> str:
        """What a connection does, for messages: 'TLS, SASL SCRAM-SHA-512 as alice'."""
        parts = ["TLS"] if self.tls is not None else []
        if self.sasl is not None:
            parts.append(f"SASL {self.sasl.mechanism} as {self.sasl.username!r}")
        return ", ".join(parts) or "plaintext"


PLAINTEXT: Final = Security()


def parse_security(configs: Mapping[str, str], name: Callable[[str], str]) -> Security:
    """The Security that Kafka client `configs` (keys without any `kafka.` prefix) describe.

    `name(key)` is how messages refer to a setting (e.g. "option kafka.sasl.mechanism" or
    "client.properties:3: sasl.mechanism").
    """
    protocol = (configs.get("security.protocol") or "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise SecurityConfigError(
            f"{name('security.protocol')}: {protocol!r} must be one of {', '.join(PROTOCOLS)}"
        )
    uses_tls = protocol in ("SSL", "SASL_SSL")
    uses_sasl = protocol.startswith("SASL_")
    for key in configs:
        if key.startswith("sasl.") and not uses_sasl:
            raise SecurityConfigError(
                f"{name(key)} is set but {name('security.protocol')} is {protocol}: set it to "
                "SASL_SSL or SASL_PLAINTEXT to log in"
            )
        if key.startswith("ssl.") and not uses_tls:
            raise SecurityConfigError(
                f"{name(key)} is set but {name('security.protocol')} is {protocol}: set it to "
                "SSL or SASL_SSL to use TLS"
            )
    tls = _tls(configs, name) if uses_tls else None
    sasl = _sasl(configs, name) if uses_sasl else None
    return Security(protocol, tls, sasl)


def _pem_type(configs: Mapping[str, str], name: Callable[[str], str], store: str) -> None:
    kind = configs.get(f"ssl.{store}.type")
    if kind is not None and kind.strip().upper() != "PEM":
        raise SecurityConfigError(
            f"{name(f'ssl.{store}.type')}: {kind.strip()!r} is not supported; kipside reads PEM "
            f"{store}s (set it to PEM, and convert the store with openssl or keytool)"
        )


def _readable(path: str, key: str, name: Callable[[str], str]) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError as exc:
        raise SecurityConfigError(f"{name(key)}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in head:
        raise SecurityConfigError(
            f"{name(key)}: {path} is not a PEM file (JKS and PKCS12 stores are not read; "
            "convert it to PEM)"
        )
    return path


def _tls(configs: Mapping[str, str], name: Callable[[str], str]) -> TlsSettings:
    _pem_type(configs, name, "truststore")
    _pem_type(configs, name, "keystore")
    trust_file = configs.get("ssl.truststore.location") or None
    trust_text = configs.get("ssl.truststore.certificates") or None
    if trust_file and trust_text:
        raise SecurityConfigError(
            f"set one of {name('ssl.truststore.location')} and "
            f"{name('ssl.truststore.certificates')}, not both"
        )
    key_file = configs.get("ssl.keystore.location") or None
    chain = configs.get("ssl.keystore.certificate.chain") or None
    key = configs.get("ssl.keystore.key") or None
    if key_file and (chain or key):
        raise SecurityConfigError(
            f"set {name('ssl.keystore.location')} or {name('ssl.keystore.key')} with "
            f"{name('ssl.keystore.certificate.chain')}, not both"
        )
    if bool(chain) != bool(key):
        raise SecurityConfigError(
            f"{name('ssl.keystore.key')} and {name('ssl.keystore.certificate.chain')} go "
            "together (the client's private key and its certificate chain, PEM)"
        )
    algorithm = (configs.get("ssl.endpoint.identification.algorithm", "https") or "").strip()
    if algorithm.lower() not in ("https", ""):
        raise SecurityConfigError(
            f"{name('ssl.endpoint.identification.algorithm')}: {algorithm!r} must be https "
            "(check the broker's name against its certificate) or empty (don't)"
        )
    settings = TlsSettings(
        truststore_location=trust_file and _readable(trust_file, "ssl.truststore.location", name),
        truststore_certificates=trust_text,
        keystore_location=key_file and _readable(key_file, "ssl.keystore.location", name),
        keystore_chain=chain,
        keystore_key=key,
        key_password=configs.get("ssl.key.password") or None,
        check_hostname=algorithm.lower() == "https",
    )
    try:
        tls_context(settings)
    except ssl.SSLError as exc:
        raise SecurityConfigError(
            f"the TLS settings ({name('ssl.truststore.location')}, "
            f"{name('ssl.keystore.location')}, ...) can't be loaded: {exc.reason or exc}"
        ) from None
    return settings


def _sasl(configs: Mapping[str, str], name: Callable[[str], str]) -> SaslSettings:
    mechanism = (configs.get("sasl.mechanism") or "GSSAPI").strip().upper()
    if mechanism not in SASL_MECHANISMS:
        raise SecurityConfigError(
            f"{name('sasl.mechanism')}: {mechanism!r} is not supported (the default is GSSAPI, "
            f"Kerberos); use one of {', '.join(SASL_MECHANISMS)}"
        )
    jaas = configs.get("sasl.jaas.config")
    if not jaas:
        raise SecurityConfigError(
            f"{name('sasl.jaas.config')} must be set for SASL, e.g. "
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="USER" '
            'password="PASSWORD";'
        )
    username, password = parse_jaas(jaas, name("sasl.jaas.config"))
    return SaslSettings(mechanism, username, password)


def parse_jaas(text: str, where: str) -> tuple[str, str]:
    """(username, password) of a JAAS entry such as Kafka's sasl.jaas.config; messages name
    `where` and never quote the text (it holds the password)."""
    words = text.strip().split(None, 2)
    module = words[0] if words else ""
    if module not in _LOGIN_MODULES:
        shown = module if module.startswith(("org.", "com.", "io.")) else "its first word"
        raise SecurityConfigError(
            f"{where}: the login module ({shown}) must be PlainLoginModule or ScramLoginModule "
            "(org.apache.kafka.common.security.plain.PlainLoginModule, "
            "org.apache.kafka.common.security.scram.ScramLoginModule)"
        )
    flag = words[1] if len(words) > 1 else ""
    options_text = words[2] if len(words) > 2 else ""
    if flag not in ("required", "requisite", "sufficient", "optional"):
        raise SecurityConfigError(
            f"{where}: the login module must be followed by its flag, `required`"
        )
    options: dict[str, str] = {}
    body = options_text.strip()
    if not body.endswith(";"):
        raise SecurityConfigError(f"{where}: a JAAS entry ends with ';'")
    body = body[:-1]
    pos = 0
    while body[pos:].strip():
        found = _JAAS_OPTION.match(body, pos)
        if found is None:
            raise SecurityConfigError(
                f"{where}: can't read the options after the login module: write them as "
                'username="USER" password="PASSWORD"'
            )
        value = found.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[found.group(1)] = value
        pos = found.end()
    missing = [k for k in ("username", "password") if not options.get(k)]
    if missing:
        raise SecurityConfigError(f"{where}: the login module needs {' and '.join(missing)}")
    return options["username"], options["password"]


_contexts: dict[TlsSettings, ssl.SSLContext] = {}


def tls_context(settings: TlsSettings) -> ssl.SSLContext:
    """The client SSLContext for `settings`, built once per process (loading the stores costs
    more than a handshake)."""
    context = _contexts.get(settings)
    if context is not None:
        return context
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if settings.truststore_location or settings.truststore_certificates:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(
            cafile=settings.truststore_location, cadata=settings.truststore_certificates
        )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = settings.check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if settings.keystore_location:
        context.load_cert_chain(settings.keystore_location, password=settings.key_password)
    elif settings.keystore_chain and settings.keystore_key:
        _load_chain_from_text(context, settings)
    _contexts[settings] = context
    return context


def _load_chain_from_text(context: ssl.SSLContext, settings: TlsSettings) -> None:
    """ssl loads a certificate and key from files only: write them to a private file that
    exists for the duration of the call."""
    assert settings.keystore_chain is not None and settings.keystore_key is not None
    with tempfile.TemporaryDirectory(prefix="kipside-keystore-") as directory:
        path = os.path.join(directory, "client.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(settings.keystore_key.strip() + "\n" + settings.keystore_chain.strip() + "\n")
        context.load_cert_chain(path, password=settings.key_password)
