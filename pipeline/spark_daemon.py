"""Spark's Python worker daemon, with the modules kipside's tasks need loaded before forking.

Spark forks a Python worker from its daemon for every task, and each one would otherwise
import PySpark's worker modules, pyarrow, kipside's own modules and (where it is installed)
pandas again: about a second of CPU per task, more than a micro-batch of the shallow mirror
costs otherwise (docs/performance.md, "Shallow mirror", has the profile).
`spark.python.daemon.module=pipeline.spark_daemon` (set by pipeline.spark) imports them once in
the daemon, and every fork shares them. Spark's planning steps run daemons of their own
(`pyspark.daemon` with the step's worker module); kipside-spark-python (pipeline.spark_python)
runs this module in their place, which loads what that step needs (PLANNING), so a step run
again and again (committing each micro-batch) forks with it already loaded.

The daemon imports only what the pipeline extra installs: pandas is not in it, and kipside's
tasks never need it. pyarrow imports pandas when it is there (on its first scalar, in every
worker), so it is preloaded only where it is installed.

Two things PySpark's own daemon is careful about, handled here:
- Forking a process with threads leaves the child without them, holding whatever lock they
  held. pyarrow's jemalloc starts a background thread at import and OpenBLAS (numpy) starts a
  pool; both are turned off before the imports (JE_ARROW_MALLOC_CONF, OPENBLAS_NUM_THREADS),
  so the daemon forks with one thread (tests/pipelines/test_spark_daemon.py checks it).
- Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the workers' PYTHONPATH, and Python
  compiles every module it imports from a zip again in every process (zips get no bytecode
  cache). When that zip belongs to the pip-installed pyspark (the same files), it is moved
  behind site-packages so the cached bytecode is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyarrow",
    "numpy",
    "kipside.pipeline.source.datasource",
    "kipside.pipeline.mirror.sink",
    "kipside.pipeline.lake.iceberg",  # the Iceberg lake's tasks: pyarrow's Parquet and compute
    "kipside.pipeline.lake.decode",
    "kio.schema.errors",
)
PRELOAD_IF_INSTALLED = ("pandas",)
PLANNING = (
    "pyarrow",
    "kipside.pipeline.source.datasource",
    "kipside.pipeline.mirror.sink",
    "kio.schema.errors",
)
"""What a planning step's forks load (creating a data source or a writer, committing a
micro-batch): the sink's commit runner forks once per micro-batch."""
_NOTHING: tuple[str, ...] = ()
_BY_WORKER = {
    "pyspark.worker": PRELOAD,
    # Finding data sources imports every pyspark_* module: no kipside module is needed there.
    "pyspark.sql.worker.lookup_data_sources": _NOTHING,
}
THREADLESS_ENV = {
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "OPENBLAS_NUM_THREADS": "1",
}


def configure() -> None:
    """Environment and sys.path for a threadless, bytecode-cached preload."""
    for key, value in THREADLESS_ENV.items():
        os.environ.setdefault(key, value)
    home = _pip_pyspark_home()
    if home is not None:
        zips = [p for p in sys.path if p.endswith(".zip") and p.startswith(home)]
        for path in zips:
            sys.path.remove(path)
        sys.path.extend(zips)  # still reachable for anything only the zips hold


def _pip_pyspark_home() -> str | None:
    """The directory of a pip-installed pyspark (its SPARK_HOME, with jars/), if any."""
    for entry in sys.path:
        candidate = os.path.join(entry, "pyspark")
        if entry.endswith("site-packages") and os.path.isdir(os.path.join(candidate, "jars")):
            return candidate + os.sep
    return None


def preload(worker_module: str = "pyspark.worker") -> None:
    """Import what the forks of a daemon for `worker_module` need (Spark's task workers by
    default; a planning step's worker module loads PLANNING and itself), and pandas with them
    where it is installed."""
    names = _BY_WORKER.get(worker_module)
    if names is None:
        names = (*PLANNING, worker_module) if worker_module.startswith("pyspark.sql.") else ()
    for name in names:
        importlib.import_module(name)
    if not names:
        return
    for name in PRELOAD_IF_INSTALLED:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


if __name__ == "__main__":
    configure()
    preload(sys.argv[1] if len(sys.argv) > 1 else "pyspark.worker")
    from pyspark.daemon import manager

    manager()
