"""kipside's TLS settings: SSL contexts built from PEM files, and who a client certificate is.

- `ListenerTls`: TLS on every client listener (`--tls-cert`, `--tls-key`, and with
  `--tls-client-ca` mutual TLS). operations.cert_reload builds a new context from the files on
  SIGHUP and when they change, and puts it in force with `use()`: new connections get the new
  certificate, open ones keep theirs; files that can't be used are `rejected()` and the
  context in force stays.
- `UpstreamTls`: TLS toward the brokers (`--upstream-ca`, optionally `--upstream-cert` and
  `--upstream-key`, and `--upstream-server-name` for the hostname check and SNI).
- `certificate_principal`: the principal Apache Kafka's default principal builder gives a TLS
  client: ``User:`` and the certificate's subject as Java's X500Principal.getName() writes it
  (RFC 2253: the last RDN first, Java's escaping, attributes without an RFC 2253 keyword as
  OID=#DER-hex), so rules and logs name clients the way the brokers' ACLs do.

TLS 1.2 is the minimum both ways. Files are read only when a context is built; a private key
is never logged or shown.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from kipside.protocol import Address
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.transport import tls

if TYPE_CHECKING:
    from cryptography import x509  # imported where used: a plaintext kipside never loads it

log = logging.getLogger("kipside.tls")

MIN_TLS_VERSION: Final = ssl.TLSVersion.TLSv1_2


class CertificateError(ValueError):
    """A certificate, key or CA file can't be used; the message names the option and file."""


@dataclass(frozen=True, slots=True)
class ListenerTlsFiles:
    """`kipside serve --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]`."""

    cert: str
    key: str
    client_ca: str | None = None
    """Mutual TLS: clients must present a certificate signed by a CA in this file."""


@dataclass(frozen=True, slots=True)
class UpstreamTlsFiles:
    """`--upstream-ca FILE [--upstream-cert FILE --upstream-key FILE] [--upstream-server-name]`."""

    ca: str
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    """The name every broker's certificate is checked against and sent as SNI (default: the
    broker's host as Metadata names it)."""


def _load_chain(context: ssl.SSLContext, cert: str, key: str, options: str) -> None:
    cert_option, key_option = options.split()
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            reason = str(exc.reason or exc)
            if "KEY_VALUES_MISMATCH" in reason:
                raise CertificateError(
                    f"{key_option} {key} is not the private key of the certificate in "
                    f"{cert_option} {cert}"
                ) from None
            from cryptography import x509

            try:
                with open(cert, "rb") as f:
                    x509.load_pem_x509_certificates(f.read())
            except (OSError, ValueError):
                bad = f"{cert_option} {cert} holds no PEM certificate (then any intermediates)"
            else:
                bad = f"{key_option} {key} holds no PEM private key (unencrypted)"
            raise CertificateError(f"{bad}: {reason}") from None
        missing = exc.filename if exc.filename else f"{cert} or {key}"
        raise CertificateError(
            f"cannot read {missing} ({cert_option}/{key_option}): {exc.strerror or exc}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca: str, option: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise CertificateError(
            f"{option} {ca} holds no usable PEM CA certificate: {exc.reason or exc}"
        ) from None
    except OSError as exc:
        raise CertificateError(f"cannot read {option} {ca}: {exc.strerror or exc}") from None


def listener_context(files: ListenerTlsFiles) -> ssl.SSLContext:
    """The SSL context of kipside's client listeners. Raises CertificateError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_TLS_VERSION
    _load_chain(context, files.cert, files.key, "--tls-cert --tls-key")
    if files.client_ca is not None:
        _load_ca(context, files.client_ca, "--tls-client-ca")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def upstream_context(files: UpstreamTlsFiles) -> ssl.SSLContext:
    """The SSL context of kipside's connections to brokers. Raises CertificateError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the name
    context.minimum_version = MIN_TLS_VERSION
    _load_ca(context, files.ca, "--upstream-ca")
    if files.cert is not None and files.key is not None:
        _load_chain(context, files.cert, files.key, "--upstream-cert --upstream-key")
    return context


def describe_certificate(path: str) -> str:
    """The first certificate of a PEM file as a log line names it: subject, serial, expiry."""
    from cryptography import x509

    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificates(f.read())[0]
    except (OSError, ValueError) as exc:
        return f"{path} (unreadable: {exc})"
    expires = cert.not_valid_after_utc
    expired = " EXPIRED" if expires < dt.datetime.now(dt.UTC) else ""
    return (
        f"{rfc2253(cert.subject)} (serial {cert.serial_number:x}, valid until "
        f"{expires:%Y-%m-%d %H:%M} UTC{expired})"
    )


class ListenerTls:
    """The TLS of kipside's client listeners; the context in force is swapped by reload()."""

    def __init__(self, files: ListenerTlsFiles) -> None:
        self.files = files
        self.context = listener_context(files)
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: str | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        """The files whose change means a reload."""
        files = self.files
        return (files.cert, files.key) + ((files.client_ca,) if files.client_ca else ())

    def describe(self) -> str:
        mtls = f", clients need a certificate from {self.files.client_ca}"
        return describe_certificate(self.files.cert) + (mtls if self.files.client_ca else "")

    def use(self, context: ssl.SSLContext, trigger: str) -> None:
        """Put a context built from the files (listener_context) in force for new
        connections; open connections keep the one they started with."""
        self.context = context
        self.reloads += 1
        self.last_error = None
        log.info("TLS certificate reloaded (%s): new connections get %s", trigger, self.describe())

    def rejected(self, error: CertificateError, trigger: str) -> None:
        """A reload found files that can't be used: the certificate in force stays."""
        self.reload_errors += 1
        self.last_error = str(error)
        log.error(
            "TLS certificate reload (%s) rejected: %s; new connections still get the "
            "certificate loaded before. Fix the files, then rewrite them or send SIGHUP",
            trigger,
            error,
        )

    async def accept(self, stream: trio.SocketStream, listener: str) -> tls.TlsWire:
        """A client's TLS connection on `listener` (raises tls.TlsError, worded)."""
        return await tls.accept(
            stream, self.context, listener=listener, client_ca=self.files.client_ca
        )

    def principal(self, wire: tls.TlsWire) -> Principal:
        """Who the client is: its certificate's subject under mTLS, else User:ANONYMOUS."""
        der = wire.tls.getpeercert(binary_form=True)
        return certificate_principal(der) if der else ANONYMOUS


class UpstreamTls:
    """TLS toward the brokers: one context for every upstream connection."""

    def __init__(self, files: UpstreamTlsFiles) -> None:
        self.files = files
        self.context = upstream_context(files)

    async def connect(self, address: Address) -> tls.TlsWire:
        return await tls.connect(
            address, self.context, server_name=self.files.server_name, ca_file=self.files.ca
        )


# The principal of a client certificate ---------------------------------------------------

# The attribute keywords Java's RFC 2253 form writes by name; every other attribute is written
# as its OID and the hex of its DER value.
_KEYWORDS: Final = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DER string types Java writes as text, and how their bytes decode.
_TEXT_TAGS: Final = {
    12: "utf-8",
    19: "latin-1",
    20: "latin-1",
    22: "latin-1",
    27: "latin-1",
    30: "utf-16-be",
}
_ESCAPED: Final = frozenset(',=+<>#;"\\')


def certificate_principal(der: bytes) -> Principal:
    """``User:`` + the subject of a DER certificate, as Kafka names an mTLS client."""
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject
    return Principal(f"User:{rfc2253(subject)}", "tls")


def rfc2253(name: x509.Name) -> str:
    """A distinguished name as Java's X500Principal.getName() (RFC 2253) writes it."""
    rdns = _der_rdns(name.public_bytes())
    return ",".join("+".join(_attribute(oid, value) for oid, value in rdn) for rdn in rdns[::-1])


def _attribute(oid: str, value: bytes) -> str:
    tag, start, end = _tlv(value, 0)
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _TEXT_TAGS:
        return f"{keyword or oid}=#{value.hex()}"
    return f"{keyword}={_escape(value[start:end].decode(_TEXT_TAGS[tag], 'replace'))}"


def _escape(text: str) -> str:
    """Java's escaping: the special characters and NUL anywhere, spaces and CRs at the ends."""
    out = ["\\" + c if c in _ESCAPED else "\\00" if c == "\0" else c for c in text]
    lead = 0
    while lead < len(out) and out[lead] in (" ", "\r"):
        out[lead] = "\\" + out[lead]
        lead += 1
    tail = len(out) - 1
    while tail >= lead and out[tail] in (" ", "\r"):
        out[tail] = "\\" + out[tail]
        tail -= 1
    return "".join(out)


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at pos."""
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    return tag, pos, pos + length


def _der_rdns(name: bytes) -> list[list[tuple[str, bytes]]]:
    """A DER Name (SEQUENCE OF SET OF SEQUENCE {OID, value}) as [[(dotted OID, value DER)]]."""
    rdns = []
    _, pos, end = _tlv(name, 0)
    while pos < end:
        _, set_pos, set_end = _tlv(name, pos)
        rdn = []
        while set_pos < set_end:
            _, ava_pos, ava_end = _tlv(name, set_pos)
            _, oid_start, oid_end = _tlv(name, ava_pos)
            rdn.append((_dotted(name[oid_start:oid_end]), name[oid_end:ava_end]))
            set_pos = ava_end
        rdns.append(rdn)
        pos = set_end
    return rdns


def _dotted(content: bytes) -> str:
    """An OBJECT IDENTIFIER's content octets as dotted decimal."""
    arcs, value = [], 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    first = min(arcs[0] // 40, 2)
    return ".".join(map(str, [first, arcs[0] - 40 * first, *arcs[1:]]))
