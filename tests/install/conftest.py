"""Harness of the install tests.

Fixtures:
  fresh_venvs  session: kipside's wheel, built from the checkout (testkit.wheel), installed
               alone and with each extra into its own fresh venv, all at once
               (install.fresh_venv.FreshVenvs; `fresh_venvs.get("pipeline")` waits for one).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testkit.wheel import build_wheel

from .fresh_venv import FreshVenvs


@pytest.fixture(scope="session")
def fresh_venvs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshVenvs]:
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source"))
    venvs = FreshVenvs(wheel, tmp_path_factory.mktemp("venvs"))
    try:
        yield venvs
    finally:
        venvs.close()
