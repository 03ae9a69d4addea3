"""Each kipside package's public API: what its __init__ lists in __all__ is there, and cheap.

Other packages import only these names (`make lint` checks that); the names that need the
pipeline or columnar extra (numba, pyspark, pyarrow) load on first use, so the sidecar and the
command line never pay for them.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

PUBLIC = ("kipside.protocol", "kipside.proxy", "kipside.rules", "kipside.pipeline")


@pytest.mark.parametrize("name", PUBLIC)
def test_every_listed_name_resolves(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if getattr(module, n, None) is None]
    assert missing == []
    assert len(set(module.__all__)) == len(module.__all__)


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    script = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.parametrize(
    ("statement", "heavy"),
    [
        ("import kipside.protocol", ("numba", "pyspark", "pyarrow")),
        ("import kipside.pipeline", ("numba", "pyspark", "pyarrow")),
        ("import kipside.rules", ("numba", "pyspark", "pyarrow")),
        ("import kipside.proxy", ("numba", "pyspark", "pyarrow", "kipside.pipeline")),
    ],
)
def test_importing_a_package_loads_no_optional_dependency(
    statement: str, heavy: tuple[str, ...]
) -> None:
    assert _loaded_after(statement, heavy) == []


def test_the_compiled_kernel_loads_on_first_use() -> None:
    statement = "import kipside.protocol as p\nassert callable(p.decode_columns)"
    assert _loaded_after(statement, ("numba",)) == ["numba"]


def test_the_columnar_codec_loads_on_first_use() -> None:
    statement = "import kipside.protocol as p\nassert callable(p.decode_columnar_batch)"
    assert _loaded_after(statement, ("pyarrow", "numba")) == ["numba", "pyarrow"]
