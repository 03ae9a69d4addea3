"""Running kipside: the admin endpoint (status page, /metrics) and rule hot reload.

Operations read the server through small Protocols (``AdminSource``, the reload's targets) and
never import the server, which builds them.
"""
