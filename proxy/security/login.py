"""kipside logging in to a broker, as a Kafka client does, on a fresh connection.

ApiVersions first (allowed before authentication); then SaslHandshake v1 and SaslAuthenticate,
or, with a broker that offers no SaslAuthenticate (before Kafka 1.0), SaslHandshake v0 and the
tokens as raw frames. Runs on a dialled `Wire` before any other request is written to it (so
before the connection is handed to an UpstreamConnection), with the principal's
`UpstreamLogin`. A broker that refuses raises `UpstreamFailed` naming the principal, the user
name, the mechanism and the broker's error, never the password.
"""

from __future__ import annotations

from kipside.protocol import (
    Address,
    FrameDecoder,
    ProtocolError,
    SaslClient,
    SaslError,
    error_name,
    new_client,
)
from kipside.proxy.core.answers import UpstreamFailed
from kipside.proxy.security.credentials import CredentialsError, UpstreamLogin
from kipside.proxy.security.sasl_messages import (
    api_versions_request,
    authenticate_request,
    authenticate_response,
    handshake_request,
    handshake_response,
    offers_authenticate,
    raw_frame,
)
from kipside.proxy.transport.wire import Wire, WireBroken

# SASL frames are small; a broker answering with more is not speaking SASL.
_MAX_FRAME = 1024 * 1024


class _Exchange:
    """One request, one answer, on a connection nothing else uses yet."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.decoder = FrameDecoder(max_frame_bytes=_MAX_FRAME, min_frame_bytes=0, from_server=True)

    async def __call__(self, frame: bytes) -> bytes:
        self.wire.write((frame,))
        while (answer := self.decoder.next_frame()) is None:
            data = await self.wire.receive()
            if not data:
                raise UpstreamFailed(
                    "the broker closed the connection during SASL authentication (a broker "
                    "speaking the legacy flow closes on wrong credentials)"
                )
            self.decoder.receive_data(data)
        return answer


async def log_in(wire: Wire, login: UpstreamLogin, address: Address) -> None:
    """Authenticate `wire` to the broker at `address` as `login`. Raises UpstreamFailed."""
    who = f"{login.username!r} ({login.mechanism}, for {login.principal})"
    try:
        client = new_client(login.mechanism, login.username, login.password().reveal())
        exchange = _Exchange(wire)
        version = 1 if offers_authenticate(await exchange(api_versions_request(0))) else 0
        answer = await exchange(handshake_request(login.mechanism, 1, version))
        error, mechanisms = handshake_response(answer, version)
        if error:
            raise UpstreamFailed(
                f"broker {address} does not offer {login.mechanism} for {who} "
                f"({error_name(error)}; it offers {', '.join(mechanisms) or 'none'})"
            )
        if version == 1:
            await _authenticate(exchange, client, address, who)
        else:
            token: bytes | None = client.first()
            while token is not None:
                token = client.step((await exchange(raw_frame(token)))[4:])
    except (CredentialsError, SaslError, ProtocolError, WireBroken, UpstreamFailed) as exc:
        raise UpstreamFailed(f"SASL login to {address} as {who}: {exc}") from None


async def _authenticate(
    exchange: _Exchange, client: SaslClient, address: Address, who: str
) -> None:
    token: bytes | None = client.first()
    correlation_id = 2
    while token is not None:
        answer = await exchange(authenticate_request(token, correlation_id))
        error, message, server_token = authenticate_response(answer)
        if error:
            raise UpstreamFailed(
                f"broker {address} refused it: {error_name(error)}: {message or 'no message'}; "
                "check the upstream credentials (--sasl-upstream)"
            )
        token = client.step(server_token)
        correlation_id += 1
