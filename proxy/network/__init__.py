"""The network shell: bytes between sockets, nothing Kafka-specific beyond what routing needs.

wire (a socket driven from trio's I/O loop), session (one client connection, answers in order),
upstream (a shareable broker connection), lanes (shared connections per node), nodes and
addresses (node listeners and address rewriting). It imports telemetry/ and kipside.protocol,
never features/, operations/ or the server: features plug in through small Protocols.
"""
