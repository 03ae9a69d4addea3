"""What kipside does to a client's request: the stages of the request pipeline, one behaviour
each (SASL, principals, versions, transactions, coalescing, short APIs, the client's own
connection).
"""
