"""The Kafka features: what kipside does to a request beyond carrying it.

routing (which connection carries a request), coalesce (multi-batch produce), transactions
(pre-registration, begin holds) and versions (ApiVersions). Each is one module with one job; they
use network/ and telemetry/, never operations/ or the server.
"""
