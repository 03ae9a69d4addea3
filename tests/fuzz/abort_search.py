"""Search kio's native decoder for bodies that abort the process, exhaust memory or hang.

    .venv/bin/python tests/fuzz/abort_search.py [--through kio|kipside] [--address-space-gib N]
        [--apis 3,18,...]

For every API key, version and direction kio knows, a skeleton body (tests/fuzz/skeletons.py:
every field set, one element per array, every tagged field present) is corrupted at every
offset with every hostile length of skeletons.MUTATIONS, and decoded: `--through kio` with kio's
own reader (what kipside did before protocol.lengths), `--through kipside` with
kipside.protocol's decode_request/decode_response (which must only ever raise DecodeError).

Cases run in a forked child, so an abort costs only the child: the parent records the case
that killed it and forks a new child from the next case. A child that reports nothing for 20 s
is a hang. RSS growth over 64 MiB in one case and any exception other than the decoder's own
are reported too. `--address-space-gib` limits the child's address space (RLIMIT_AS), as a
smaller machine or a container with `ulimit -v` would: by default this machine's overcommit
grants a 16 GiB reservation (an int32 count of 2**31-1) and refuses 32 GiB.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from pkgutil import resolve_name
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kio.schema.index import api_key_map
from kio.serial import entity_reader

from fuzz.skeletons import Body, bodies, mutants
from kipside.protocol import DecodeError, decode_request, decode_response
from kipside.protocol.messages import KIO_DECODE_ERRORS

HANG_SECONDS = 20.0
RSS_REPORT_KIB = 64 * 1024

Case = tuple[Body, str, int, bytes]
Decode = Callable[[Body, bytes], object]


def cases(apis: set[int] | None) -> list[Case]:
    found: list[Case] = []
    for body in bodies():
        if apis is not None and body.api_key not in apis:
            continue
        for mutation, offset, data in mutants(body):
            found.append((body, mutation, offset, data))
    return found


def through_kio(body: Body, data: bytes) -> object:
    return entity_reader(resolve_name(body.path))(data, 0)


def through_kipside(body: Body, data: bytes) -> object:
    decode = decode_request if body.kind == "request" else decode_response
    return decode(body.api_key, body.api_version, data, 0)


def run_child(all_cases: Sequence[Case], start: int, decode: Decode, out: TextIO) -> None:
    """Decode from case `start` on; before each case "S index", after it
    "E index outcome rss-growth-KiB seconds [detail]"."""
    expected: tuple[type[BaseException], ...] = (
        KIO_DECODE_ERRORS if decode is through_kio else (DecodeError,)
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for index in range(start, len(all_cases)):
        body, _mutation, _offset, data = all_cases[index]
        out.write(f"S {index}\n")
        out.flush()
        began = time.perf_counter()
        detail = ""
        try:
            decode(body, data)
            outcome = "decoded"
        except MemoryError:
            outcome = "MemoryError"
        except expected:
            outcome = "refused"
        except Exception as exc:
            outcome = f"unexpected-{type(exc).__name__}"
            detail = " ".join(str(exc).split())[:80]
        took = time.perf_counter() - began
        now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out.write(f"E {index} {outcome} {now - rss} {took:.3f} {detail}\n")
        rss = now
    out.write("DONE\n")
    out.flush()


def fork_child(
    all_cases: Sequence[Case], start: int, decode: Decode, limit_gib: float | None
) -> tuple[int, TextIO, TextIO]:
    read_fd, write_fd = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: decode until done or dead
        os.close(read_fd)
        os.close(err_read)
        os.dup2(err_write, 2)
        os.environ["RUST_BACKTRACE"] = "0"
        if limit_gib is not None:
            size = int(limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        with os.fdopen(write_fd, "w") as out:
            run_child(all_cases, start, decode, out)
        os._exit(0)
    os.close(write_fd)
    os.close(err_write)
    return pid, os.fdopen(read_fd), os.fdopen(err_read)


def label(case: Case) -> str:
    body, mutation, offset, _data = case
    return f"{body} ({body.path}), {mutation} at byte {offset}"


Found = dict[str, list[tuple[Case, str]]]


def search(all_cases: Sequence[Case], decode: Decode, limit_gib: float | None) -> Found:
    """Every case that aborted, hung, ran out of memory, raised something unexpected or grew
    RSS, by kind; "decoded" and "refused" hold the counts of the ordinary outcomes."""
    found: Found = defaultdict(list)
    outcomes: Counter[str] = Counter()
    start = 0
    while start < len(all_cases):
        pid, out, err = fork_child(all_cases, start, decode, limit_gib)
        last, done = start, False
        while True:
            ready, _, _ = select.select([out], [], [], HANG_SECONDS)
            if not ready:
                found["hang"].append((all_cases[last], f"no answer in {HANG_SECONDS:.0f} s"))
                os.kill(pid, signal.SIGKILL)
                break
            line = out.readline()
            if not line:
                break
            kind, *rest = line.rstrip("\n").split(" ", 5)
            if kind == "S":
                last = int(rest[0])
            elif kind == "DONE":
                done = True
            else:
                case, outcome, grown, took, detail = all_cases[int(rest[0])], *rest[1:]
                outcomes[outcome] += 1
                if outcome not in ("decoded", "refused"):
                    found[outcome].append((case, detail or outcome))
                if int(grown) > RSS_REPORT_KIB:
                    found["rss"].append((case, f"+{int(grown) // 1024} MiB in {took} s"))
        _, status = os.waitpid(pid, 0)
        message = err.read().strip().splitlines()
        out.close()
        err.close()
        if done:
            break
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            found["abort" if sig == "SIGABRT" else sig].append(
                (all_cases[last], message[0] if message else sig)
            )
        start = last + 1
    print(f"decoded {outcomes['decoded']}, refused {outcomes['refused']}")
    return found


def report(found: Found, total: int, seconds: float) -> None:
    print(f"{total} cases in {seconds:.0f} s")
    if not found:
        print("no abort, MemoryError, hang, unexpected exception or RSS growth")
    for what, hits in sorted(found.items()):
        print(f"\n{what}: {len(hits)} cases")
        per_message: dict[str, list[int]] = defaultdict(list)
        reasons: Counter[str] = Counter()
        for case, reason in hits:
            body = case[0]
            per_message[f"{api_key_map[body.api_key]} {body.kind}"].append(body.api_version)
            reasons[f"{case[1]}: {reason}"] += 1
        for message, versions in sorted(per_message.items()):
            listed = ", ".join(f"v{v}" for v in sorted(set(versions)))
            print(f"  {message}: {listed}")
        print("  by mutation and message:")
        for reason, count in reasons.most_common(8):
            print(f"    {count:6d}  {reason}")
        print(f"  first: {label(hits[0][0])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--through", choices=("kio", "kipside"), default="kipside")
    parser.add_argument("--address-space-gib", type=float, default=None)
    parser.add_argument("--apis", default=None, help="comma-separated API keys (default: all)")
    args = parser.parse_args()
    apis = {int(a) for a in args.apis.split(",")} if args.apis else None
    all_cases = cases(apis)
    decode = through_kio if args.through == "kio" else through_kipside
    limit = f", address space {args.address_space_gib} GiB" if args.address_space_gib else ""
    print(f"decoding through {args.through}{limit}", flush=True)
    began = time.perf_counter()
    found = search(all_cases, decode, args.address_space_gib)
    report(found, len(all_cases), time.perf_counter() - began)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
