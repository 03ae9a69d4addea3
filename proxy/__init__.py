"""kipside's sidecar: a Kafka wire-protocol proxy on trio, over the kipside.protocol codec.

``run(ServerConfig(...))`` serves until SIGTERM/SIGINT; ``Server`` is the same thing for a
caller that already runs trio (tests, embedding). The ``kipside`` command (kipside.proxy.cli)
builds a ``ServerConfig`` from its options (TLS as ``ListenerTlsFiles``, ``UpstreamTlsFiles``).

The subpackages are layers, each importing only the ones below it (``make lint`` checks it):
operations/ (admin endpoint, rule reload) > session/ (the client connection driver) > stages/
(the request pipeline) > upstream/ (broker connections, lanes, nodes) > security/ (certificates,
SASL) > transport/ (sockets, TLS, dialling) > core/ (the sans-I/O decisions) > telemetry/
(stats, metrics, tracing). server.py sits above them all, cli.py on top.
This package must never import kipside.pipeline: the pipelines are found through entry points.
"""

from kipside.protocol import Address
from kipside.proxy.security.certificates import ListenerTlsFiles, UpstreamTlsFiles
from kipside.proxy.server import Server, ServerConfig, StartupError, run

__all__ = [
    "Address",
    "ListenerTlsFiles",
    "Server",
    "ServerConfig",
    "StartupError",
    "UpstreamTlsFiles",
    "run",
]
