"""Bytes on sockets: the socket driver (`wire`), TLS on it (`tls`), how a broker is dialled
(`dial`), and waiting for an answer (`waiting`). Nothing here knows a Kafka API.
"""
