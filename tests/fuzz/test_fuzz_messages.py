"""Hostile bodies for every message kipside decodes with kio: only DecodeError, never an abort.

kio's native reader reserves memory from an array's count before reading an element and aborts
the process when that fails (protocol.lengths). The abort-prone cases therefore run in a child
process under an address-space limit (RLIMIT_AS, 2 GiB), where any reservation in proportion
to a hostile count fails at once: first kio alone, which must abort there (so the limit and the
harness are shown to catch it), then kipside.protocol on every hostile length at every offset
of every message the proxy decodes, which must refuse each with DecodeError. Hypothesis then
corrupts every message kio knows (kipside pcap decodes any request) in this process, with
tracemalloc watching what a decode allocates. `tests/fuzz/abort_search.py` runs the exhaustive
search over every message kio knows (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from pkgutil import resolve_name

from hypothesis import given
from hypothesis import strategies as st
from kio.serial import entity_reader

from fuzz.hostile import corrupted, fuzz
from fuzz.skeletons import Body, bodies
from kipside.protocol import ApiKey, DecodeError, decode_request, decode_response

TESTS = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT = 60.0
ADDRESS_SPACE = 2 * 2**30
# What one hostile decode of a body of a few hundred bytes may allocate in Python objects.
DECODE_ALLOCATION_LIMIT = 256 * 1024
# What the proxy decodes with kio: SASL, ApiVersions, the answers naming brokers (addresses),
# the transaction calls it takes, the partition-led requests a principals rule reads.
PROXY_READS = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.METADATA,
        ApiKey.FIND_COORDINATOR,
        ApiKey.SASL_HANDSHAKE,
        ApiKey.API_VERSIONS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.TXN_OFFSET_COMMIT,
        ApiKey.SASL_AUTHENTICATE,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.SHARE_FETCH,
        ApiKey.SHARE_ACKNOWLEDGE,
    }
)


def decode(body: Body, data: bytes) -> object:
    reader = decode_request if body.kind == "request" else decode_response
    return reader(body.api_key, body.api_version, data, 0)


def run_limited(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a child Python limited to ADDRESS_SPACE bytes of address space."""
    prelude = textwrap.dedent(
        f"""
        import resource, sys
        sys.path.insert(0, {str(TESTS)!r})
        resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env={"RUST_BACKTRACE": "0", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_kio_alone_aborts_the_process_on_a_huge_count() -> None:
    """The hazard, shown: a Metadata v2 response claiming 2**31-1 brokers (16 GiB reserved)."""
    child = run_limited(
        """
        from kio.schema.metadata.v2.response import MetadataResponse
        from kio.serial import entity_reader
        entity_reader(MetadataResponse)((2**31 - 1).to_bytes(4, "big"), 0)
        print("survived")
        """
    )
    assert child.returncode == -signal.SIGABRT, (child.returncode, child.stdout, child.stderr)
    assert "memory allocation of 17179869176 bytes failed" in child.stderr
    assert "survived" not in child.stdout


def test_every_hostile_length_the_proxy_reads_is_refused_in_a_limited_process() -> None:
    """Every hostile length of skeletons.MUTATIONS at every offset of every version of every
    message the proxy decodes with kio (~60,000 bodies), decoded by kipside.protocol under the
    2 GiB limit: each is decoded or refused with DecodeError; nothing aborts, runs out of
    memory or raises anything else."""
    apis = sorted(int(key) for key in PROXY_READS)
    child = run_limited(
        f"""
        from collections import Counter
        from fuzz.skeletons import bodies, mutants
        from kipside.protocol import DecodeError, decode_request, decode_response

        outcomes = Counter()
        for body in bodies(frozenset({apis})):
            decode = decode_request if body.kind == "request" else decode_response
            for mutation, offset, data in mutants(body):
                try:
                    decode(body.api_key, body.api_version, data, 0)
                    outcomes["decoded"] += 1
                except DecodeError:
                    outcomes["refused"] += 1
                except BaseException as exc:
                    print(f"{{body}} {{mutation}}@{{offset}}: {{exc!r}}")
                    raise
        print(outcomes["decoded"], outcomes["refused"])
        """
    )
    assert child.returncode == 0, (child.returncode, child.stdout[-2000:], child.stderr[-2000:])
    decoded, refused = map(int, child.stdout.split())
    assert decoded + refused == 61_654 and refused > 30_000, child.stdout


def test_every_valid_skeleton_still_decodes() -> None:
    """The length checks refuse nothing valid: each skeleton (every field set, every tagged
    field present) decodes through kipside to what kio alone reads."""
    for body in bodies():
        expected, _size = entity_reader(resolve_name(body.path))(body.data, 0)
        assert decode(body, body.data) == expected, str(body)


@fuzz(800)
@given(body=st.sampled_from(bodies()), data=st.data())
def test_corrupted_messages_raise_only_decode_error(body: Body, data: st.DataObject) -> None:
    hostile = data.draw(corrupted(body.data), label="body")
    tracemalloc.start()
    try:
        decode(body, hostile)
    except DecodeError:
        pass
    finally:
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < DECODE_ALLOCATION_LIMIT, f"{body}: {peak} bytes allocated"


@fuzz(300)
@given(body=st.sampled_from(bodies()), junk=st.binary(max_size=64))
def test_random_bytes_raise_only_decode_error(body: Body, junk: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(body, junk)
