"""SASL in kipside: a client connection's SASL (carried or answered), the credentials files,
and kipside logging in to the brokers for a principal. See docs/security.md."""

from kipside.proxy.security.client_sasl import ClientSasl, SaslStep, Termination
from kipside.proxy.security.credentials import (
    CredentialsError,
    CredentialStore,
    Secret,
    UpstreamLogin,
    UpstreamLogins,
    load_credentials,
    load_upstream_logins,
    with_user,
    write_credentials,
)
from kipside.proxy.security.login import log_in

__all__ = [
    "ClientSasl",
    "CredentialStore",
    "CredentialsError",
    "SaslStep",
    "Secret",
    "Termination",
    "UpstreamLogin",
    "UpstreamLogins",
    "load_credentials",
    "load_upstream_logins",
    "log_in",
    "with_user",
    "write_credentials",
]
