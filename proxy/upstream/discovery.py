"""Node discovery: at start, kipside asks a bootstrap broker which nodes the cluster has.

One Metadata v1 request with no topics, over whatever connection `dial` gives (TLS and a SASL
login when so configured). Later changes to the node list are learned from the clients' own
Metadata answers (nodes.py), not by polling.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence

import trio

from kipside.protocol import (
    INT32,
    Address,
    ApiKey,
    FrameDecoder,
    NotKafkaError,
    ProtocolError,
    build_frame,
    decode_response,
    encode_request_header,
    parse_response_header,
)
from kipside.proxy.core.answers import UpstreamFailed
from kipside.proxy.transport.dial import Dial, plain_dial
from kipside.proxy.transport.wire import WireBroken

__all__ = ["discover_nodes"]

log = logging.getLogger("kipside.server")

_ANSWER_SECONDS = 5.0
_SILENT = (
    f"connected, but no answer to a Metadata request within {_ANSWER_SECONDS:g} s: is it a "
    "Kafka listener?"
)


async def discover_nodes(
    upstreams: Sequence[Address], problems: list[str], dial: Dial = plain_dial, *, tls: bool = False
) -> list[tuple[int, str, int]]:
    """Ask the first bootstrap broker that answers for its nodes: [(node_id, host, port)].

    Connects with `dial` (TLS if so configured). Retries until cancelled; each distinct failure
    is logged once and added to `problems`. When every bootstrap broker answered in another
    protocol than Kafka (HTTP, TLS on a plaintext dial), waiting will not help: raises
    NotKafkaError at once, its reason in `problems`.
    """
    request = build_frame(encode_request_header(ApiKey.METADATA, 1, 1, "kipside"), INT32.pack(0))
    while True:
        foreign: list[NotKafkaError] = []
        for upstream in upstreams:
            try:
                with trio.fail_after(_ANSWER_SECONDS):
                    return await _metadata_once(upstream, request, dial, tls)
            except trio.TooSlowError:
                _note(problems, f"{upstream}: {_SILENT}")
            except NotKafkaError as exc:
                foreign.append(exc)
                _note(problems, f"{upstream}: {exc}{_advice(exc, tls)}")
            except (OSError, WireBroken, ProtocolError, UpstreamFailed) as exc:
                _note(problems, f"{upstream}: {exc}")
        if len(foreign) == len(upstreams):
            raise foreign[-1]
        await trio.sleep(0.5)


def _note(problems: list[str], problem: str) -> None:
    if problem not in problems:
        log.warning("upstream bootstrap %s", problem)
        problems.append(problem)


def _advice(exc: NotKafkaError, tls: bool) -> str:
    if exc.protocol == "TLS" and not tls:
        return "; its listener uses TLS: start kipside with --upstream-ca FILE"
    return "; --upstream must name the brokers' Kafka listeners"


async def _speaks_tls(upstream: Address) -> bool:
    """Whether `upstream` completes a TLS handshake. A TLS listener closes a plaintext
    connection without a word (OpenSSL and Java send no alert), which reads like a broker
    restarting; a handshake tells the two apart. Nothing is trusted or sent over it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with trio.fail_after(_ANSWER_SECONDS):
            stream = await trio.open_ssl_over_tcp_stream(
                upstream.host, upstream.port, ssl_context=context
            )
            try:
                await stream.do_handshake()
            finally:
                await trio.aclose_forcefully(stream)
    except (OSError, trio.BrokenResourceError, trio.TooSlowError):
        return False
    return True


async def _metadata_once(
    upstream: Address, request: bytes, dial: Dial, tls: bool
) -> list[tuple[int, str, int]]:
    wire = await dial(upstream)
    try:
        wire.write((request,))
        decoder = FrameDecoder(min_frame_bytes=4, from_server=True)
        while (frame := decoder.next_frame()) is None:
            data = await wire.receive()
            if not data:
                if not tls and decoder.buffered == 0 and await _speaks_tls(upstream):
                    raise NotKafkaError(
                        "closed the connection at a plaintext Kafka request and answers a TLS "
                        "handshake",
                        protocol="TLS",
                    )
                raise ProtocolError("closed the connection during discovery")
            decoder.receive_data(data)
    finally:
        wire.close()
    header = parse_response_header(frame, ApiKey.METADATA, 1)
    message = decode_response(ApiKey.METADATA, 1, frame, header.body_offset)
    return [(int(b.node_id), str(b.host), int(b.port)) for b in message.brokers]
