"""Integration tests: real clients, the real broker (Tansu), kipside in between."""
