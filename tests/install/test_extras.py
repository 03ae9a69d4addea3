"""Each extra, installed alone from a wheel of the checkout into a fresh venv, runs what it is for.

The dev venv holds every extra, so there a module that only another extra (or the test extra)
installs goes unnoticed; here it fails a test before a user finds it:

- no extra (the sidecar): `kipside serve` in front of Tansu and `kipside dev` get to `kipside:
  ready` and pass real traffic (confluent-kafka from this process; the README's kcat demo for
  `kipside dev`), and the pipeline and capture commands name the extra they lack;
- [pcap]: `kipside pcap summary --json` and `compare` print the committed outputs of the golden
  captures (tests/captures/golden);
- [pipeline]: Spark's worker daemon preloads only what is installed; `kipside mirror --once` and
  `kipside lake --once` copy and land a small topic (every codec, malformed values, a committed
  and an aborted transaction), and a plain PySpark session reads it with format("kipside"). The
  three Spark applications run at once, and Spark's logs name no missing module.

The venvs are installed concurrently (conftest.py); the sidecar and capture tests run while the
pipeline's venv is still installing.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from conftest import fresh_topic
from pipelines.kafka_data import (
    JSON_SCHEMA,
    JsonDataset,
    Rec,
    by_partition,
    consume_all,
    produce_json_dataset,
    produce_plain,
    records_of,
)
from testkit import procs, tools
from testkit.broker import Broker, start_tansu
from testkit.kipside import start_kipside, start_kipside_dev, tail

from .fresh_venv import FreshVenv, FreshVenvs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GOLDEN = Path(__file__).resolve().parents[1] / "captures" / "golden" / "coalescing"
PARTITIONS = 2
COMMAND_TIMEOUT = 60.0
# A fresh venv writes its modules' bytecode on first import (install.fresh_venv), so the first
# start of kipside takes longer than the harness's usual READY_TIMEOUT on a busy machine.
READY_TIMEOUT = 60.0
# The three Spark applications run at once, each to its end, within the module fixture (the
# suite's per-test watchdog, tests/conftest.py, does not cover it): on 2 busy cores each takes
# minutes.
SPARK_TIMEOUT = 360.0


def _run(
    args: Sequence[str | Path], venv: FreshVenv, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        env=venv.env(),
        cwd=cwd,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


# --------------------------------------------------------------------------- the sidecar alone


def _round_trip(bootstrap: str, prefix: str) -> None:
    """Records produced through `bootstrap` read back, in order, through it."""
    topic = fresh_topic(bootstrap, prefix, PARTITIONS)
    sent = produce_plain(bootstrap, topic, PARTITIONS, 300)
    assert records_of(consume_all(bootstrap, topic, PARTITIONS, timeout=30)) == by_partition(sent)


def test_serve_alone_passes_traffic(fresh_venvs: FreshVenvs, tmp_path: Path) -> None:
    venv = fresh_venvs.get("")
    with start_tansu() as broker:
        ks = start_kipside(
            broker, tmp_path, timeout=READY_TIMEOUT, binary=venv.kipside, env=venv.env()
        )
        try:
            _round_trip(ks.bootstrap, "alone-serve")
        finally:
            code = ks.stop()
        assert code == 0, tail(ks.log())


def test_dev_alone_runs_the_readme_demo(fresh_venvs: FreshVenvs, tmp_path: Path) -> None:
    """The README's traffic: four kcat producers of 20,000 lines, one kcat consumer counting;
    and the status page it names (package data the wheel must carry)."""
    kcat = tools.find("kcat", "the README's demo through `kipside dev`")
    venv = fresh_venvs.get("")
    lines = tmp_path / "lines"
    lines.write_text("".join(f"{n}\n" for n in range(1, 20_001)))
    dev = start_kipside_dev(
        tmp_path / "dev", timeout=READY_TIMEOUT, binary=venv.kipside, env=venv.env()
    )
    try:
        produce = [kcat, "-b", dev.bootstrap, "-P", "-t", "demo"]
        produce += ["-X", "linger.ms=0", "-X", "batch.num.messages=50"]
        producers = []
        for _ in range(4):
            with lines.open("rb") as feed:
                producers.append(
                    procs.track(subprocess.Popen(produce, stdin=feed, stderr=subprocess.PIPE))
                )
        for producer in producers:
            _, err = producer.communicate(timeout=COMMAND_TIMEOUT)
            assert producer.returncode == 0, err.decode(errors="replace")
        consume = [kcat, "-b", dev.bootstrap, "-C", "-t", "demo", "-e", "-o", "beginning", "-q"]
        read = subprocess.run(consume, capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
        assert read.returncode == 0, read.stderr.decode(errors="replace")
        assert len(read.stdout.splitlines()) == 80_000
        page = re.search(r"status page (http://\S+/) ", dev.stdout_path.read_text())
        assert page is not None, dev.stdout_path.read_text()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(page.group(1), timeout=5) as reply:
            assert reply.status == 200 and b"<html" in reply.read().lower()
    finally:
        code = dev.stop()
    assert code == 0, tail(dev.log())


def test_without_extras_the_pipeline_and_capture_commands_name_their_extra(
    fresh_venvs: FreshVenvs, tmp_path: Path
) -> None:
    venv = fresh_venvs.get("")
    nowhere = "127.0.0.1:1"
    copy = ["--source", nowhere, "--dest", nowhere, "--topics", "t", "--once"]
    mirror = _run([venv.kipside, "mirror", *copy, "--checkpoint", tmp_path / "ck"], venv)
    assert mirror.returncode == 2 and "pip install 'kipside[pipeline]'" in mirror.stderr, mirror
    pcap = _run([venv.kipside, "pcap", "summary", GOLDEN / "client.pcap"], venv)
    assert pcap.returncode == 2 and "pip install 'kipside[pcap]'" in pcap.stderr, pcap


# --------------------------------------------------------------------------- [pcap]


def test_pcap_extra_alone_reads_the_golden_captures(fresh_venvs: FreshVenvs) -> None:
    venv = fresh_venvs.get("pcap")
    # The committed outputs name the captures relatively: run where they are.
    summary = _run([venv.kipside, "pcap", "summary", "--json", "client.pcap"], venv, GOLDEN)
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout) == json.loads((GOLDEN / "summary-client.json").read_text())
    compare = _run([venv.kipside, "pcap", "compare", "client.pcap", "broker.pcap"], venv, GOLDEN)
    assert compare.returncode == 0, compare.stderr
    assert compare.stdout == (GOLDEN / "compare.txt").read_text()


# --------------------------------------------------------------------------- [pipeline]


def test_spark_worker_daemon_preloads_only_what_the_pipeline_extra_installs(
    fresh_venvs: FreshVenvs,
) -> None:
    venv = fresh_venvs.get("pipeline")
    probe = "import kipside.pipeline.spark_daemon as d; d.configure(); d.preload()"
    done = _run([venv.python, "-c", probe], venv)
    assert done.returncode == 0, done.stderr


# A plain PySpark session, as in docs/lake.md: nothing registered, kipside found by Spark.
PLAIN_READ = """
import json, sys
from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1:3]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
df = (
    spark.read.format("kipside")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .load()
)
rows = df.select("partition", "offset", "value").collect()
print(json.dumps([[r.partition, r.offset, r.value and bytes(r.value).hex()] for r in rows]))
spark.stop()
"""


@dataclass(frozen=True)
class Finished:
    """A Spark application of the pipeline venv, once it has exited."""

    name: str
    code: int | None
    """None: still running at SPARK_TIMEOUT, and killed."""
    stdout: str
    stderr: str
    seconds: float

    def spark_log(self) -> str:
        """What Spark logged: its log file (named by kipside's CLI), else its stderr."""
        named = re.search(r"Spark's log: (\S+)", self.stderr)
        if named is None or not Path(named.group(1)).exists():
            return self.stderr
        return Path(named.group(1)).read_text(errors="replace")

    def explain(self) -> str:
        how = f"exited {self.code}" if self.code is not None else "was killed"
        errors = [ln for ln in self.spark_log().splitlines() if "Error" in ln][:20]
        return (
            f"{self.name} {how} after {self.seconds:.0f} s\n--- stdout ---\n{self.stdout[-3000:]}"
            f"\n--- stderr ---\n{self.stderr[-3000:]}\n--- errors in Spark's log ---\n"
            + "\n".join(errors)
        )


def _finish(name: str, proc: subprocess.Popen[str], started: float) -> Finished:
    """Wait for `proc` until SPARK_TIMEOUT after `started`; kill it then."""
    code: int | None
    try:
        out, err = proc.communicate(timeout=max(1.0, started + SPARK_TIMEOUT - time.monotonic()))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        code = None
    return Finished(name, code, out, err, time.monotonic() - started)


@dataclass(frozen=True)
class PipelineRuns:
    data: JsonDataset
    committed: dict[int, list[tuple[int, Rec]]]
    """The source's records that read_committed readers must see: (offset, record) by partition."""
    dest: Broker
    lake_out: Path
    mirror: Finished
    lake: Finished
    plain_read: Finished


@pytest.fixture(scope="module")
def pipeline_runs(
    fresh_venvs: FreshVenvs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PipelineRuns]:
    """A small topic, then the mirror, the lake and a plain session's read of it, all at once
    from the pipeline venv, each to its end (the tests check what they left)."""
    tools.find("java", "Spark")
    venv = fresh_venvs.get("pipeline")
    tmp = tmp_path_factory.mktemp("pipeline")
    with start_tansu() as source, start_tansu() as dest:
        topic = fresh_topic(source.bootstrap, "alone-pipeline", PARTITIONS)
        data = produce_json_dataset(source.bootstrap, topic, PARTITIONS, per_codec=20)
        aborted = set(data.aborted)
        committed = {
            p: [(offset, r) for offset, r in records if r.value not in aborted]
            for p, records in consume_all(source.bootstrap, topic, PARTITIONS).items()
        }
        schema = tmp / "orders.json"
        schema.write_text(json.dumps(JSON_SCHEMA))
        once = ["--topics", re.escape(topic), "--once"]
        clusters = ["--source", source.bootstrap, "--dest", dest.bootstrap]
        table: list[str | Path] = ["--schema", schema, "--out", tmp / "lake"]
        table += ["--checkpoint", tmp / "lake-ck"]
        apps: dict[str, tuple[list[str | Path], bool]] = {
            "kipside mirror": (
                [venv.kipside, "mirror", *clusters, *once, "--checkpoint", tmp / "mirror-ck"],
                False,
            ),
            "kipside lake": (
                [venv.kipside, "lake", "--bootstrap", source.bootstrap, *once, *table],
                False,
            ),
            # A user's PySpark finds the workers' Python on PATH: the activated venv's.
            "format('kipside')": ([venv.python, "-c", PLAIN_READ, source.bootstrap, topic], True),
        }
        started = time.monotonic()
        running = {
            name: procs.track(
                subprocess.Popen(
                    [str(a) for a in args],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=venv.env(activated=activated),
                    cwd=tmp,
                )
            )
            for name, (args, activated) in apps.items()
        }
        mirror, lake, plain = (_finish(name, proc, started) for name, proc in running.items())
        yield PipelineRuns(data, committed, dest, tmp / "lake", mirror, lake, plain)


@pytest.mark.spark
def test_mirror_alone_copies_the_committed_records(pipeline_runs: PipelineRuns) -> None:
    runs = pipeline_runs
    assert runs.mirror.code == 0, runs.mirror.explain()
    got = records_of(consume_all(runs.dest.bootstrap, runs.data.topic, PARTITIONS))
    want = {p: [r for _, r in records] for p, records in runs.committed.items()}
    assert got == want
    count = sum(map(len, want.values()))
    assert f"{count:,} records" in runs.mirror.stderr, runs.mirror.stderr


@pytest.mark.spark
def test_lake_alone_lands_every_row(pipeline_runs: PipelineRuns) -> None:
    runs = pipeline_runs
    assert runs.lake.code == 0, runs.lake.explain()
    rows = ds.dataset(str(runs.lake_out), format="parquet", partitioning="hive").to_table()
    assert sorted(rows.column("id").to_pylist()) == sorted(v["id"] for _, v, _ in runs.data.good)
    quarantine = ds.dataset(str(runs.lake_out / "_quarantine"), format="parquet").to_table()
    assert quarantine.num_rows == len(runs.data.bad)


@pytest.mark.spark
def test_a_plain_pyspark_session_reads_format_kipside(pipeline_runs: PipelineRuns) -> None:
    runs = pipeline_runs
    assert runs.plain_read.code == 0, runs.plain_read.explain()
    rows = json.loads(runs.plain_read.stdout.strip().splitlines()[-1])
    got = {(p, offset, value) for p, offset, value in rows}
    want = {
        (p, offset, r.value.hex() if r.value is not None else None)
        for p, records in runs.committed.items()
        for offset, r in records
    }
    assert len(rows) == len(got) and got == want


@pytest.mark.spark
def test_spark_logs_name_no_missing_module(pipeline_runs: PipelineRuns) -> None:
    for app in (pipeline_runs.mirror, pipeline_runs.lake, pipeline_runs.plain_read):
        missing = [ln for ln in app.spark_log().splitlines() if "No module named" in ln]
        assert not missing, f"{app.name}: {missing[:5]}"
