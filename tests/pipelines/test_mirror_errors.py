"""Bad input to `kipside mirror`: each gives one clear line naming what and where, exit 1, and
never a silent skip of data."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import create_topics, fresh_topic, unique_name
from testkit.broker import Broker
from testkit.ports import free_port

from kipside.pipeline.jobrun import root_cause
from kipside.pipeline.kafka.admin import partition_counts
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.mirror.job import MirrorJob
from kipside.protocol import Address

from .conftest import mirror_once, run_cli, run_in_process
from .fault_relays import (
    CorruptingFetchRelay,
    DeletedRecordsRelay,
    RefusingProduceRelay,
    broker_behind,
)
from .kafka_data import consume_all, produce_plain, records_of

pytestmark = [pytest.mark.integration]


def _mirror(source: str, dest: str, topics: str, checkpoint: Path, *extra: str) -> tuple[int, str]:
    args = ["--source", source, "--dest", dest, "--topics", topics, "--checkpoint", str(checkpoint)]
    result = run_cli("mirror", *args, "--once", "--timeout", "3", *extra, timeout=180)
    return result.code, result.stderr


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("kipside mirror: error: ")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


def test_unreachable_source(dest_broker: Broker, tmp_path: Path) -> None:
    port = free_port()
    code, stderr = _mirror(f"127.0.0.1:{port}", dest_broker.bootstrap, "t", tmp_path / "ck")
    assert code == 1
    line = _error_line(stderr)
    assert f"source cluster at 127.0.0.1:{port}" in line and "gave up after" in line, line
    assert "Connection refused" in line or "connection refused" in line.lower(), line


def test_unreachable_destination(source_broker: Broker, tmp_path: Path) -> None:
    topic = fresh_topic(source_broker.bootstrap, "err-dest", 1)
    port = free_port()
    code, stderr = _mirror(
        source_broker.bootstrap, f"127.0.0.1:{port}", re.escape(topic), tmp_path / "ck"
    )
    assert code == 1
    line = _error_line(stderr)
    assert f"destination cluster at 127.0.0.1:{port}" in line and "gave up after" in line, line


def test_no_topic_matches(source_broker: Broker, dest_broker: Broker, tmp_path: Path) -> None:
    code, stderr = _mirror(
        source_broker.bootstrap, dest_broker.bootstrap, "no-such-topic-.*", tmp_path / "ck"
    )
    assert code == 1
    line = _error_line(stderr)
    assert "--topics 'no-such-topic-.*' matches no topic of the source cluster" in line, line
    assert "must match whole names" in line, line


def test_a_bad_regex_names_the_option(
    source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    code, stderr = _mirror(
        source_broker.bootstrap, dest_broker.bootstrap, "orders[", tmp_path / "ck"
    )
    assert code == 2  # a command-line mistake, found before anything is dialled
    assert "--topics: 'orders[' is not a regular expression" in _error_line(stderr)


def _fails_with(spark: Any, job: MirrorJob) -> str:
    """Run the mirror on the test session; the root cause the CLI would print."""
    with pytest.raises(Exception) as failure:
        run_in_process(spark, job)
    return root_cause(failure.value)


@pytest.mark.spark
def test_a_corrupt_batch_stops_the_mirror_before_it(
    spark: Any, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name("err-crc")
    with broker_behind(CorruptingFetchRelay(topic, base_offset=0)) as source:
        create_topics(source.bootstrap, [topic], 1)
        produce_plain(source.bootstrap, topic, 1, 50, codec="none")
        cause = _fails_with(
            spark,
            mirror_once(
                source.bootstrap, dest_broker.bootstrap, topic, tmp_path / "ck", rename="crc."
            ),
        )
        assert source.relay.problems() == []
        assert isinstance(source.relay, CorruptingFetchRelay) and source.relay.corrupted > 0
    assert (
        f"{topic}-0: the record batch at offset 0" in cause and "fails its CRC-32C check" in cause
    ), cause
    # Nothing at or after a corrupt batch may be copied (here: nothing at all).
    dest = KafkaClient([Address(dest_broker.host, dest_broker.port)], role="destination")
    if "crc." + topic in partition_counts(dest, ["crc." + topic]):
        assert not records_of(consume_all(dest_broker.bootstrap, "crc." + topic, 1, timeout=30))


@pytest.mark.spark
def test_a_destination_that_refuses_writes(
    spark: Any, source_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "err-refused", 2)
    produce_plain(source_broker.bootstrap, topic, 2, 40)
    with broker_behind(RefusingProduceRelay("denied.")) as dest:
        cause = _fails_with(
            spark,
            mirror_once(
                source_broker.bootstrap, dest.bootstrap, topic, tmp_path / "ck", rename="denied."
            ),
        )
        assert isinstance(dest.relay, RefusingProduceRelay) and dest.relay.refused > 0
        assert dest.relay.problems() == []
    assert "the destination refused a write" in cause and "TOPIC_AUTHORIZATION_FAILED" in cause, (
        cause
    )
    assert re.search(rf"denied\.{re.escape(topic)}-[01]", cause), cause


@pytest.mark.spark
def test_deleted_offsets_fail_the_mirror_unless_told_to_skip(
    spark: Any, dest_broker: Broker, tmp_path: Path
) -> None:
    """failOnDataLoss, as Spark's Kafka source: offsets deleted before the mirror copied them
    stop it with the range that is lost; --no-fail-on-data-loss skips them and says so."""
    topic = unique_name("err-lost")
    checkpoint = tmp_path / "ck"
    relay = DeletedRecordsRelay()
    with broker_behind(relay) as source:
        create_topics(source.bootstrap, [topic], 1)
        first = produce_plain(source.bootstrap, topic, 1, 300)
        job = mirror_once(source.bootstrap, dest_broker.bootstrap, topic, checkpoint)
        run_in_process(spark, job)
        # Two flushes, so a batch starts at 450: batches are copied whole, and a log start
        # inside a batch would bring that batch's earlier records along.
        lost = produce_plain(source.bootstrap, topic, 1, 150, start=300)
        kept = produce_plain(source.bootstrap, topic, 1, 150, start=450)
        relay.delete_before(topic, 0, 450)

        cause = _fails_with(spark, job)
        assert f"{topic}-0: offsets 300 to 449 are no longer in the source cluster" in cause, cause
        assert "--no-fail-on-data-loss" in cause, cause

        code, stderr = _mirror(
            source.bootstrap,
            dest_broker.bootstrap,
            re.escape(topic),
            checkpoint,
            "--no-fail-on-data-loss",
        )
        assert code == 0, stderr
        assert relay.problems() == []
    assert f"kipside mirror: warning: {topic}-0: offsets 300 to 449 are no longer" in stderr, stderr
    assert "skipped 150 offsets (failOnDataLoss=false)" in stderr, stderr
    got = records_of(consume_all(dest_broker.bootstrap, topic, 1))
    assert got == {0: first + kept}
    assert not set(lost) & set(got[0])


@pytest.mark.spark
def test_a_failed_task_is_reported_by_its_root_cause_in_one_line(
    spark: Any, tmp_path: Path
) -> None:
    """Any exception a Python task raises (not only kipside's own) is what the job prints, not
    Spark's [STREAM_FAILED] wrapping."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"o": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"o": 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Any:
            import kipside_tests_no_such_module  # type: ignore[import-not-found]  # noqa: F401

            yield (1,)

    class Missing(DataSource):
        @classmethod
        def name(cls) -> str:
            return "kipside-tests-missing-module"

        def schema(self) -> str:
            return "x int"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Reader()

    spark.dataSource.register(Missing)
    query = (
        spark.readStream.format(Missing.name())
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as failure:
        query.awaitTermination(120)
    assert "[STREAM_FAILED]" in str(failure.value)
    cause = root_cause(failure.value)
    assert cause == "ModuleNotFoundError: No module named 'kipside_tests_no_such_module'"
