"""A real Spark standalone cluster for the pipeline tests: a master and workers, each a separate
JVM started from the PySpark install with `spark-class`, on loopback.

`standalone_cluster(workers=2)` starts them and waits until the master's JSON status lists
every worker ALIVE; `Cluster.kill_worker(i)` SIGKILLs a worker and everything it started (its
executors and their Python workers), as when a machine is lost; `add_worker()` starts one more.
Every process is tracked (testkit.procs), so the hang watchdog kills them too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from testkit import procs
from testkit.ports import free_port

READY_SECONDS = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class Cluster:
    workdir: Path
    port: int
    ui_port: int
    master: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
            "PYSPARK_PYTHON": str(Path(sys.executable).with_name("kipside-spark-python")),
        }

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
        )
        return procs.track(proc)

    def add_worker(self) -> subprocess.Popen[bytes]:
        n = len(self.workers)
        worker = self._start(
            f"worker-{n}",
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
            *("--webui-port", str(free_port()), "--work-dir", str(self.workdir / "work")),
        )
        self.workers.append(worker)
        return worker

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            answer: dict[str, Any] = json.load(r)
        return answer

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def wait_for_workers(self, count: int) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while self.alive_workers() < count:
            if self.master.poll() is not None:
                raise AssertionError(f"the Spark master exited: see {self.workdir}/master.log")
            assert time.monotonic() < deadline, f"fewer than {count} Spark workers alive"
            time.sleep(0.3)

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` and every process under it (executors, Python workers)."""
        root = psutil.Process(self.workers[index].pid)
        for proc in [*root.children(recursive=True), root]:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        self.workers[index].wait(30)

    def executors(self) -> list[psutil.Process]:
        """The executor JVMs the live workers started."""
        found = []
        for worker in self.workers:
            if worker.poll() is None:
                with suppress(psutil.NoSuchProcess):
                    found += psutil.Process(worker.pid).children()
        return found


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2) -> Iterator[Cluster]:
    workdir.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    cluster = Cluster(workdir, port, ui_port, master=None)  # type: ignore[arg-type]
    cluster.master = cluster._start(
        "master",
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)),
    )
    try:
        for _ in range(workers):
            cluster.add_worker()
        cluster.wait_for_workers(workers)
        yield cluster
    finally:
        for worker in list(cluster.workers):
            procs.stop(worker)
        procs.stop(cluster.master)
