"""pipeline.spark_daemon preloads modules for Spark's forked workers: it must fork with one
thread (a thread's locks would be held forever in the child) and import the installed
pyspark, not the zip Spark puts first on PYTHONPATH. This venv has pandas (the test extra), so
it is preloaded too; tests/install/ checks the daemon where the pipeline extra alone is
installed, without pandas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from kipside.pipeline.spark_daemon import PRELOAD, PRELOAD_IF_INSTALLED

PROBE = """
import json, os, sys
import kipside.pipeline.spark_daemon as d
d.configure()
d.preload()
import pyspark

from kipside.pipeline.spark_daemon import PRELOAD, PRELOAD_IF_INSTALLED
tasks = os.listdir("/proc/self/task")
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)
loaded = [m for m in (*PRELOAD, *PRELOAD_IF_INSTALLED) if m in sys.modules]
print(json.dumps({"threads": threads, "pyspark": pyspark.__file__, "loaded": loaded}))
"""


def test_the_daemon_forks_with_one_thread_and_the_cached_pyspark() -> None:
    home = Path(pyspark.__file__).parent
    zips = [
        str(home / "python" / "lib" / "pyspark.zip"),
        *map(str, (home / "python" / "lib").glob("py4j-*.zip")),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}  # as Spark's workers get it
    env.pop("OPENBLAS_NUM_THREADS", None)
    env.pop("JE_ARROW_MALLOC_CONF", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["threads"] == ["python"], result["threads"]
    assert ".zip" not in result["pyspark"] and result["pyspark"].startswith(str(home))
    # Every module of both lists: this venv has pandas.
    assert result["loaded"] == [*PRELOAD, *PRELOAD_IF_INSTALLED], result["loaded"]
