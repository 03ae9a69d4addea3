"""What the Fetch codec tests share: the versions the codec speaks and hypothesis' building
blocks for its fields. Used by test_fetch_request (requests) and test_fetch (responses); it
holds no tests.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kipside.protocol.fetch import MAX_VERSION, MIN_VERSION

VERSIONS = list(range(MIN_VERSION, MAX_VERSION + 1))

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
