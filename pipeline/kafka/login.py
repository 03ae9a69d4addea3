"""Logging in to a broker with SASL on a fresh connection, as Kafka's clients do.

After ApiVersions (which a broker answers before authentication): SaslHandshake v1 naming the
mechanism, then SaslAuthenticate requests carrying the tokens of protocol.sasl's PLAIN or SCRAM
client, which decides every token and checks the broker's final SCRAM signature; this module
only carries them. Brokers older than Kafka 1.0 (no SaslAuthenticate: tokens as raw frames)
are refused with a message saying so.

Every failure is SecurityError naming the broker, the user and the mechanism, and the broker's
own words, never the password: a wrong password is not retried.
"""

from __future__ import annotations

from typing import Final

from kipside.protocol import (
    ApiKey,
    SaslError,
    VersionRange,
    build_request,
    encode_message,
    error_name,
    new_client,
    pick_version,
)

from .connection import BrokerConnection
from .errors import SecurityError
from .security import SaslSettings

__all__ = ["log_in"]

SASL_HANDSHAKE: Final = VersionRange(1, 1)
SASL_AUTHENTICATE: Final = VersionRange(0, 2)


def log_in(
    conn: BrokerConnection,
    versions: dict[int, VersionRange],
    sasl: SaslSettings,
    hint: str,
) -> None:
    """Authenticate `conn` as `sasl` says; `hint` names the setting to fix on failure (e.g.
    "kafka.sasl.jaas.config"). Raises SecurityError, or ConnectionFailed if the connection
    breaks."""
    who = f"as {sasl.username!r} ({sasl.mechanism})"
    if ApiKey.SASL_AUTHENTICATE not in versions:
        raise SecurityError(
            f"SASL login to {conn.name} {who}: the broker speaks only the SASL flow of Kafka "
            "before 1.0 (no SaslAuthenticate), which kipside's pipelines do not"
        )
    handshake_version = pick_version(
        ApiKey.SASL_HANDSHAKE, versions, SASL_HANDSHAKE, broker_name=conn.name
    )
    handshake = conn.request(
        ApiKey.SASL_HANDSHAKE,
        handshake_version,
        encode_message(
            build_request(ApiKey.SASL_HANDSHAKE, handshake_version, {"mechanism": sasl.mechanism})
        ),
    ).decode()
    if int(handshake.error_code):
        offered = ", ".join(str(m) for m in handshake.mechanisms) or "none"
        raise SecurityError(
            f"SASL login to {conn.name} {who}: the broker does not offer {sasl.mechanism} "
            f"({error_name(int(handshake.error_code))}; it offers {offered}). Set "
            "sasl.mechanism to one it offers"
        )
    version = pick_version(
        ApiKey.SASL_AUTHENTICATE, versions, SASL_AUTHENTICATE, broker_name=conn.name
    )
    try:
        client = new_client(sasl.mechanism, sasl.username, sasl.password)
        token: bytes | None = client.first()
        while token is not None:
            body = encode_message(
                build_request(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": token})
            )
            answer = conn.request(ApiKey.SASL_AUTHENTICATE, version, body).decode()
            code = int(answer.error_code)
            if code:
                said = f": {answer.error_message}" if answer.error_message else ""
                raise SecurityError(
                    f"SASL login to {conn.name} {who} failed: the broker answered "
                    f"{error_name(code)}{said}. Check the user name and password in {hint}"
                )
            token = client.step(bytes(answer.auth_bytes))
    except SaslError as exc:
        raise SecurityError(f"SASL login to {conn.name} {who} failed: {exc}") from None
