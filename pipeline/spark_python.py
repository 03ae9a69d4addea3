"""`kipside-spark-python`: the Python that Spark starts for kipside's sessions (PYSPARK_PYTHON).

Spark starts many Python processes for one query: a daemon per kind of planning step (looking up
data sources, creating them, planning reads, creating writers, committing), the streaming
source's runner, and the task workers' daemon. Each gets `$SPARK_HOME/python/lib/pyspark.zip`
first on PYTHONPATH, and Python compiles every module it imports from a zip again in every
process (a zip gets no bytecode cache): about 0.8 CPU-seconds a process here. When that zip
belongs to the pip-installed pyspark this interpreter would import anyway (the same files),
this launcher takes it off PYTHONPATH (pyspark and py4j then come from site-packages, with their
cached bytecode) and becomes the real interpreter (exec) with the same arguments. Any other
PYTHONPATH entry, and a Spark installed apart from pip, are left as they are.

The daemons Spark starts for its planning steps (`-m pyspark.daemon WORKER_MODULE`) are run as
kipside.pipeline.spark_daemon instead, which forks them with what they need already imported.

It must stay cheap: it runs before every Spark Python process, so it imports nothing beyond
the standard library's os and sys.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main", "without_pip_zips"]


def _pip_pyspark_home(paths: list[str]) -> str | None:
    """The directory of a pip-installed pyspark (its SPARK_HOME, with jars/), if any."""
    for entry in paths:
        candidate = os.path.join(entry, "pyspark")
        if entry.endswith("site-packages") and os.path.isdir(os.path.join(candidate, "jars")):
            return candidate + os.sep
    return None


def without_pip_zips(pythonpath: str, site_paths: list[str]) -> str:
    """`pythonpath` without the zips of the pip-installed pyspark found on `site_paths` (the
    same modules are in site-packages)."""
    home = _pip_pyspark_home(site_paths)
    if home is None:
        return pythonpath
    entries = [e for e in pythonpath.split(os.pathsep) if e]
    return os.pathsep.join(e for e in entries if not (e.endswith(".zip") and e.startswith(home)))


def main() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = without_pip_zips(env.get("PYTHONPATH", ""), sys.path)
    args = sys.argv[1:]
    if args[:2] == ["-m", "pyspark.daemon"]:
        # A planning step's daemon: kipside's daemon preloads what the step's forks load.
        args[1] = "kipside.pipeline.spark_daemon"
    os.execve(sys.executable, [sys.executable, *args], env)
