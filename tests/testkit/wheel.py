"""kipside's wheel, built from the checkout the way a user's `pip install .` builds it.

    wheel = build_wheel(tmp / "wheel", scratch=tmp / "source")

The build reads a copy of what the Dockerfile copies too (pyproject.toml, README.md and the
package folders pyproject maps, plus pyspark_kipside): a build/ folder left in the checkout by
an earlier build could otherwise lend the wheel files that no longer exist. pip builds it with
no dependencies and no network (setuptools is pinned in pyproject's build-system and installed
in the venv running the build).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

__all__ = ["PACKAGE_DIRS", "PACKAGE_FOLDERS", "REPO", "build_wheel"]

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]
"""kipside.* package name -> its folder at the top of the checkout."""
PACKAGE_FOLDERS = (*PACKAGE_DIRS.values(), "pyspark_kipside")
"""Every folder the wheel is built from: the mapped ones and the Spark shim (its own name)."""


def build_wheel(out: Path, scratch: Path) -> Path:
    """Build kipside's wheel into `out` from a copy of the checkout made in `scratch` (both
    created); return the wheel's path. A failed build raises with pip's output."""
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, scratch / name)
    skip = shutil.ignore_patterns("__pycache__")
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(REPO / folder, scratch / folder, ignore=skip)
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out)]
    done = subprocess.run([*build, str(scratch)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel {scratch} failed:\n{done.stdout}\n{done.stderr}")
    (found,) = out.glob("kipside-*.whl")
    return found
