"""kipside as a user installs it: a wheel built from the checkout, installed with one extra (or
none) into a fresh venv, and each install running what it is for (tests/install/test_extras.py).
"""
