"""The bottom layer of kipside.proxy: stats, metrics and tracing, imported by everything above.

It must never import another part of kipside.proxy.
"""
