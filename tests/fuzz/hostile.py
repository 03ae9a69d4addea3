"""What the fuzz tests share: deterministic hypothesis settings and hostile edits of valid bytes.

`FUZZ` makes every fuzz test the same on every run (derandomize: examples come from the test's
own name, no example database), so CI never fails on a case it has not seen before; a failure
prints the bytes that caused it. `corrupted(base)` draws one to three edits of a valid message:
a hostile length (skeletons.MUTATIONS: the largest int16/int32, negative lengths, varints of
2**31-1 and 2**32-1 and longer than five bytes) written at some offset, a byte changed, the
end cut off, or bytes inserted.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fuzz.skeletons import MUTATIONS, mutate

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    """FUZZ with this many examples."""
    return settings(FUZZ, max_examples=examples)


@st.composite
def corrupted(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 3), label="edits")):
        kind = draw(st.sampled_from(["length", "length", "byte", "cut", "insert"]), label="kind")
        at = draw(st.integers(0, max(len(data) - 1, 0)), label="at")
        if kind == "length":
            name = draw(st.sampled_from(sorted(MUTATIONS)), label="length")
            width = MUTATIONS[name][0]
            if at + width <= len(data):
                data = bytearray(mutate(bytes(data), at, name))
        elif kind == "byte" and data:
            data[at] = draw(st.integers(0, 255), label="byte")
        elif kind == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8), label="inserted")
    return bytes(data)
