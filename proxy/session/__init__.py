"""Client connections: the trio driver of one client connection (`session`), the answers it
owes rewritten for the client (`answers`), and its SASL steps (`sasl_steps`).
"""
