"""Bytes on sockets: the socket driver (`wire`), TLS on it (`tls`), how a broker is dialled
(`dial`), and what a client may make kipside hold and for how long (`limits`, `deadlines`).
Nothing here knows a Kafka API.
"""
