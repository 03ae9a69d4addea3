"""Node discovery: at start, kipside asks a bootstrap broker which nodes the cluster has.

One Metadata v1 request with no topics, over whatever connection `dial` gives (TLS and a SASL
login when so configured). Later changes to the node list are learned from the clients' own
Metadata answers (nodes.py), not by polling.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from kipside.protocol import (
    INT32,
    Address,
    ApiKey,
    FrameDecoder,
    ProtocolError,
    build_frame,
    decode_response,
    encode_request_header,
    parse_response_header,
)
from kipside.proxy.network.upstream import Dial, UpstreamFailed, plain_dial
from kipside.proxy.network.wire import WireBroken

__all__ = ["discover_nodes"]

log = logging.getLogger("kipside.server")


async def discover_nodes(
    upstreams: Sequence[Address], problems: list[str], dial: Dial = plain_dial, *, tls: bool = False
) -> list[tuple[int, str, int]]:
    """Ask the first bootstrap broker that answers for its nodes: [(node_id, host, port)].

    Connects with `dial` (TLS if so configured). Retries until cancelled; each distinct failure
    is logged once and added to `problems`.
    """
    request = build_frame(encode_request_header(ApiKey.METADATA, 1, 1, "kipside"), INT32.pack(0))
    while True:
        for upstream in upstreams:
            try:
                with trio.fail_after(5):
                    return await _metadata_once(upstream, request, dial, tls)
            except (OSError, trio.TooSlowError, WireBroken, ProtocolError, UpstreamFailed) as exc:
                problem = f"{upstream}: {exc or 'timed out'}"
                if problem not in problems:
                    log.warning("upstream bootstrap %s; retrying", problem)
                    problems.append(problem)
        await trio.sleep(0.5)


async def _metadata_once(
    upstream: Address, request: bytes, dial: Dial, tls: bool
) -> list[tuple[int, str, int]]:
    wire = await dial(upstream)
    try:
        wire.write((request,))
        decoder = FrameDecoder(min_frame_bytes=4)
        while (frame := decoder.next_frame()) is None:
            data = await wire.receive()
            if not data:
                # A TLS listener closes on plaintext (OpenSSL and Java send no alert first).
                hint = "" if tls else "; if its listener uses TLS, start kipside with --upstream-ca"
                raise ProtocolError(f"closed the connection during discovery{hint}")
            decoder.receive_data(data)
    finally:
        wire.close()
    header = parse_response_header(frame, ApiKey.METADATA, 1)
    message = decode_response(ApiKey.METADATA, 1, frame, header.body_offset)
    return [(int(b.node_id), str(b.host), int(b.port)) for b in message.brokers]
