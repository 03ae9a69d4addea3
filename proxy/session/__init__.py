"""Client connections: the trio driver of one client connection (`session`), its read loop
(`reading`), what it does with each decision (`carrying_out`), its own broker connection
(`own_connection`), and the answers it owes rewritten for the client (`answers`).
"""
