"""The built wheel: kipside installs as one namespace, kipside.*, and pyspark_kipside.

A wheel is built from the checkout (no network, no dependencies) and read as a user's environment
would see it: its top-level names, the package data it must carry, and every public package
imported from the wheel's own files rather than the editable link tree.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from testkit.wheel import PACKAGE_DIRS, build_wheel

PUBLIC = (
    "kipside.protocol",
    "kipside.proxy",
    "kipside.rules",
    "kipside.pipeline",
    "kipside.evidence",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source"))


def test_only_kipside_and_the_spark_shim_are_top_level(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"kipside", "pyspark_kipside"}


def test_package_data_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kipside/pipeline/resources/log4j2.properties" in names
    for page in ("status.html", "status.css", "status.js"):  # the admin status page
        assert f"kipside/proxy/operations/admin/static/{page}" in names, page
    for package in PACKAGE_DIRS:
        assert f"{package.replace('.', '/')}/py.typed" in names, package


def test_public_packages_import_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    # The wheel's files first; the editable link tree (build/__editable__...) left out entirely.
    script = (
        "import sys, importlib\n"
        f"sys.path[:] = [{str(tmp_path)!r}] + [p for p in sys.path if '__editable__' not in p]\n"
        f"for name in {PUBLIC!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(tmp_path)!r}), module.__file__\n"
        "    assert module.__all__, name\n"
        "    print(name, len(module.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(PUBLIC)
