"""kipside as the benchmarks run it: a snapshot of the working tree, the tree of a baseline git
ref, and the counters of its admin endpoint (/metrics).

Never edits the checkout: snapshots and baseline trees are copies in directories the caller
owns and removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from _harness import HOST, REPO, kipside_available

KIPSIDE_PACKAGES = ("protocol", "proxy", "rules")
SNAPSHOT_ATTEMPTS = 6
SNAPSHOT_RETRY_S = 10.0


def snapshot_kipside(dest: Path) -> tuple[bool, str, str]:
    """Copy kipside's packages to `dest` and make every child process import them from there.

    The working tree may change while the benchmark runs (other engineers edit it); from a
    snapshot every configuration runs the same code. The console script `kipside` imports
    `proxy` through sys.path, where PYTHONPATH comes before the editable install. A snapshot
    that cannot start (a file caught mid-edit) is taken again, a bounded number of times.
    Returns (usable, error, sha256 of the copied sources, 12 hex digits).
    """
    why = ""
    for attempt in range(SNAPSHOT_ATTEMPTS):
        if attempt:
            time.sleep(SNAPSHOT_RETRY_S)
        shutil.rmtree(dest, ignore_errors=True)
        digest = hashlib.sha256()
        for pkg in KIPSIDE_PACKAGES:
            shutil.copytree(
                REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
            for f in sorted((dest / pkg).rglob("*.py")):
                digest.update(f.relative_to(dest).as_posix().encode() + b"\0" + f.read_bytes())
        ok, why = kipside_available(source=dest)
        if ok:
            old = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = str(dest) + (os.pathsep + old if old else "")
            return True, "", digest.hexdigest()[:12]
        print(f"kipside from a snapshot does not start ({why}); again", file=sys.stderr)
    return False, why, ""


def baseline_tree(ref: str, dest: Path) -> str:
    """Extract the whole tree of git `ref` into `dest` (for `start_kipside(source=dest)`).

    The whole tree, not only kipside's packages: the CLI loads its subcommands' entry points
    (pipeline/), which must come from the same commit. Returns the commit's short hash.
    """
    commit = _git("rev-parse", "--short=12", f"{ref}^{{commit}}").decode().strip()
    archive = _git("archive", "--format=tar", commit)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def _git(*args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def scrape(admin_port: int) -> dict[str, float]:
    """kipside's /metrics as {'name{labels}': value}."""
    url = f"http://{HOST}:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def produce_counts(metrics: dict[str, float]) -> tuple[float, float]:
    """Produce requests kipside received from clients and sent upstream, from /metrics."""
    return (
        metrics.get('kipside_client_requests_total{api="Produce"}', 0.0),
        metrics.get('kipside_upstream_requests_total{api="Produce"}', 0.0),
    )
