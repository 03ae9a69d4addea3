"""Broker connections: one connection's trio driver (`connection`), the lanes shared per node
and principal (`lanes`), the nodes and their listeners (`nodes`), start-up discovery
(`discovery`) and the rewriting of broker addresses to kipside's (`addresses`).
"""
