"""The Spark session the pipeline's commands run on, and what it must not print.

`kipside mirror` and `kipside lake` own the terminal: Spark's stage progress bars and INFO/WARN
logs would bury their progress line, so the JVM logs errors only (pipeline/resources/
log4j2.properties) and the console progress bar is off. Python workers run the same
interpreter as the driver (PYSPARK_PYTHON), so they import this package and pyarrow. The
kipside source is registered on the session, so jobs work whether or not Spark found the
pyspark_kipside module on its own; the mirror registers its own sink (this module must not import
the jobs that use it).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from pyspark.sql import SparkSession

from kipside.pipeline.kafka.security import SECRET_CONFIGS

__all__ = ["spark_python", "start_session"]


@contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """File descriptor 2 points at `path` while the JVM is launched, so the JVM inherits it;
    this process's stderr is restored afterwards."""
    if path is None:
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


# Spark's default, plus the Kafka settings that hold a secret whatever their value looks like
# (a PEM key inline): Spark hides an option's value when its name or value matches.
REDACTION_REGEX = "(?i)secret|password|token|access[.]?key|" + "|".join(
    sorted(name.replace(".", "[.]") for name in SECRET_CONFIGS)
)


def _log4j_config() -> str:
    return str(resources.files("kipside.pipeline") / "resources" / "log4j2.properties")


def spark_python() -> str:
    """The Python for Spark's workers: kipside-spark-python beside this interpreter when it is
    installed (see pipeline.spark_python), else this interpreter."""
    launcher = Path(sys.executable).with_name("kipside-spark-python")
    return str(launcher) if os.access(launcher, os.X_OK) else sys.executable


def start_session(
    app_name: str,
    master: str,
    conf: Mapping[str, str] | None = None,
    *,
    log_path: str | None = None,
    java_options: str = "",
) -> SparkSession:
    """A session on `master` with kipside's source registered and Spark kept quiet.

    With `log_path`, the JVM (and the Python workers it starts) write their stderr there: the
    JVM prints a few lines at start that no log setting silences. `java_options` go to the
    driver's and executors' JVMs, after kipside's own.
    """
    os.environ.setdefault("PYSPARK_PYTHON", spark_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", module="pyspark")
    java_options = f"-Dlog4j2.configurationFile=file:{_log4j_config()} {java_options}".strip()
    builder = SparkSession.builder.appName(app_name)
    if os.environ.get("KIPSIDE_UNDER_SPARK_SUBMIT") != "1":
        builder = builder.master(master)  # under spark-submit, its --master stands
    builder = (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.python.daemon.module", "kipside.pipeline.spark_daemon")
        .config("spark.redaction.regex", REDACTION_REGEX)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with _stderr_to(log_path):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from kipside.pipeline.source.datasource import KipsideDataSource

    spark.dataSource.register(KipsideDataSource)
    return spark
