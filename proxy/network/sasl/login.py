"""kipside logging in to a broker: SaslHandshake v1 and SaslAuthenticate on a fresh connection.

Runs on a dialled `Wire` before any other request is written to it (so before the connection is
handed to an UpstreamConnection), with the principal's `UpstreamLogin`. A broker that refuses
raises `UpstreamFailed` naming the principal, the user name, the mechanism and the broker's
error, never the password.
"""

from __future__ import annotations

from kipside.protocol import (
    Address,
    FrameDecoder,
    ProtocolError,
    SaslError,
    error_name,
    new_client,
)
from kipside.proxy.network.sasl.credentials import CredentialsError, UpstreamLogin
from kipside.proxy.network.sasl.kafka import (
    authenticate_request,
    authenticate_response,
    handshake_request,
    handshake_response,
)
from kipside.proxy.network.upstream import UpstreamFailed
from kipside.proxy.network.wire import Wire, WireBroken

# SASL frames are small; a broker answering with more is not speaking SASL.
_MAX_FRAME = 1024 * 1024


async def _exchange(wire: Wire, decoder: FrameDecoder, frame: bytes) -> bytes:
    wire.write((frame,))
    while (answer := decoder.next_frame()) is None:
        data = await wire.receive()
        if not data:
            raise UpstreamFailed("the broker closed the connection during SASL authentication")
        decoder.receive_data(data)
    return answer


async def log_in(wire: Wire, login: UpstreamLogin, address: Address) -> None:
    """Authenticate `wire` to the broker at `address` as `login`. Raises UpstreamFailed."""
    who = f"{login.username!r} ({login.mechanism}, for {login.principal})"
    try:
        password = login.password()
        client = new_client(login.mechanism, login.username, password.reveal())
        decoder = FrameDecoder(max_frame_bytes=_MAX_FRAME)
        error, mechanisms = handshake_response(
            await _exchange(wire, decoder, handshake_request(login.mechanism, 0))
        )
        if error:
            raise UpstreamFailed(
                f"broker {address} does not offer {login.mechanism} for {who} "
                f"({error_name(error)}; it offers {', '.join(mechanisms) or 'none'})"
            )
        token: bytes | None = client.first()
        correlation_id = 1
        while token is not None:
            answer = await _exchange(wire, decoder, authenticate_request(token, correlation_id))
            error, message, server_token = authenticate_response(answer)
            if error:
                raise UpstreamFailed(
                    f"broker {address} refused kipside's SASL login as {who}: "
                    f"{error_name(error)}: {message or 'no message'}; check the upstream "
                    "credentials (--sasl-upstream)"
                )
            token = client.step(server_token)
            correlation_id += 1
    except (CredentialsError, SaslError) as exc:
        raise UpstreamFailed(f"SASL login to {address} as {who}: {exc}") from None
    except (ProtocolError, WireBroken) as exc:
        raise UpstreamFailed(f"SASL login to {address} as {who}: {exc}") from None
