"""The admin endpoint: an h11 server (httpd) in front of its routes (routes), a status page
shipped as static files (static/), and request rates (rates).

It reads the server through `AdminSource` and never imports proxy.server, which builds it.
"""

from kipside.proxy.operations.admin.httpd import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    REQUEST_DEADLINE_SECONDS,
    Reply,
)
from kipside.proxy.operations.admin.rates import RateWindow
from kipside.proxy.operations.admin.routes import AdminApp, AdminSource, serve_admin

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "REQUEST_DEADLINE_SECONDS",
    "AdminApp",
    "AdminSource",
    "RateWindow",
    "Reply",
    "serve_admin",
]
