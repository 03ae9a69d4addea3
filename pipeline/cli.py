"""`kipside mirror` (and its `translate`) and `kipside lake`: the pipeline's commands, registered
on the `kipside` command line through the `kipside.commands` entry point group.

This module only parses arguments and hands over to pipeline.mirror; it must stay cheap to
import (no pyspark here), because `kipside serve` loads it to build its parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kipside.pipeline.mirror.offset_sync import DEFAULT_TOPIC

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["register_lake", "register_mirror"]

_Job = TypeVar("_Job", bound="DataclassInstance")

_MIRROR_EPILOG = """\
examples:
  kipside mirror --source src:9092 --dest dst:9092 --topics 'orders|payments' \\
      --checkpoint /var/lib/kipside/mirror --once
  kipside mirror translate --source src:9092 --dest dst:9092 --group billing --commit

The mirror copies record batches as they are (never decompressed), read_committed by default,
at least once across restarts. See docs/mirror.md.
"""


def _size(text: str) -> int:
    """A byte count, with an optional K, M or G suffix (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    factor = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = int(float(number) * factor)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size like 268435456, 256M or 1G"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _count(text: str) -> int:
    """A positive whole number."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """What every pipeline command takes about running: where its progress is kept, Spark, data
    loss, retry time and Spark configuration."""
    parser.add_argument("--checkpoint", metavar="DIR", help="Spark checkpoint (progress) directory")
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    parser.add_argument(
        "--no-fail-on-data-loss",
        dest="fail_on_data_loss",
        action="store_false",
        help="skip offsets deleted before they were read, instead of failing "
        "(failOnDataLoss=false)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to keep retrying an unreachable cluster (default 60)",
    )
    parser.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration",
    )


def register_mirror(sub: Any) -> None:
    parser = sub.add_parser(
        "mirror",
        help="copy topics between clusters as raw record batches (a Spark job)",
        description="Copy topics between Kafka clusters batch for batch, never decompressing "
        "them, as a Spark Structured Streaming job (KIP-712's shallow mirror).",
        epilog=_MIRROR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action", nargs="?", choices=["translate"], help="translate: map a group's offsets"
    )
    parser.add_argument("--source", metavar="HOST:PORT[,...]", help="source cluster bootstrap")
    parser.add_argument("--dest", metavar="HOST:PORT[,...]", help="destination cluster bootstrap")
    parser.add_argument("--topics", metavar="REGEX", help="source topics to copy (whole names)")
    parser.add_argument(
        "--rename", metavar="PREFIX", default="", help="prefix destination topic names"
    )
    parser.add_argument(
        "--read-uncommitted",
        action="store_true",
        help="copy batches of aborted and open transactions too (read_committed by default)",
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=_size,
        default=256 << 20,
        metavar="N",
        help="about how many source bytes one micro-batch copies (default 256M)",
    )
    parser.add_argument("--once", action="store_true", help="copy what is there now, then stop")
    parser.add_argument(
        "--offset-sync-topic",
        dest="sync_topic",
        default=DEFAULT_TOPIC,
        metavar="TOPIC",
        help="compacted topic on the destination recording where batches landed ('' for none)",
    )
    _add_run_options(parser)
    parser.add_argument("--group", help="translate: the consumer group")
    parser.add_argument(
        "--commit", action="store_true", help="translate: commit on the destination"
    )
    parser.add_argument("--json", dest="as_json", action="store_true", help="translate: print JSON")
    parser.set_defaults(handler=_mirror)


def _pipeline_missing() -> str | None:
    """Why the pipeline can't run here, if the `pipeline` extra is not installed."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return (
            f"{exc.name} is not installed: the pipelines need kipside's pipeline extra "
            "(pip install 'kipside[pipeline]') and Java 17 for Spark"
        )
    return None


def _ready(command: str, args: argparse.Namespace, required: Sequence[str]) -> bool:
    """Whether `kipside COMMAND` can start: the pipeline extra is installed and every required
    option is given. If not, says why on stderr."""
    problem = _pipeline_missing()
    if problem is None:
        missing = [f"--{name.replace('_', '-')}" for name in required if not getattr(args, name)]
        problem = f"{', '.join(missing)} required" if missing else None
    if problem is not None:
        print(f"kipside {command}: error: {problem}", file=sys.stderr)
    return problem is None


def _job(cls: type[_Job], args: argparse.Namespace) -> _Job:
    """The job the command line describes: each option's dest is the name of the job's field it
    sets, and the run options give timeout_ms and conf."""
    given = vars(args) | {"timeout_ms": int(args.timeout * 1000), "conf": dict(args.conf)}
    return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})


def _mirror(args: argparse.Namespace) -> int:
    if args.action == "translate":
        if not _ready("mirror translate", args, ("source", "dest", "group")):
            return 2
        from kipside.pipeline.mirror.translate import TranslateJob, run_translate

        return run_translate(_job(TranslateJob, args), sys.stdout, sys.stderr)
    if not _ready("mirror", args, ("source", "dest", "topics", "checkpoint")):
        return 2
    from kipside.pipeline.mirror.job import MirrorJob, run_mirror

    return run_mirror(_job(MirrorJob, args))


_LAKE_EPILOG = """\
example:
  kipside lake --bootstrap kafka:9092 --topics 'orders|payments' --schema orders.json \\
      --out /data/lake --checkpoint /data/lake-checkpoint --once

Each record's JSON value becomes a row of the schema's columns; values that don't fit go to
quarantine with the reason. Exactly once across restarts. See docs/lake.md.
"""


def register_lake(sub: Any) -> None:
    parser = sub.add_parser(
        "lake",
        help="write topics to Parquet through a JSON schema (a Spark job)",
        description="Ingest Kafka topics into Parquet tables: JSON values decoded into typed "
        "columns, partitioned by topic and date, exactly once (KIP-1008's ingestion consumer).",
        epilog=_LAKE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT[,...]", help="Kafka bootstrap brokers")
    parser.add_argument("--topics", metavar="REGEX", help="topics to ingest (whole names)")
    parser.add_argument(
        "--schema",
        metavar="FILE",
        help="the values' schema: Spark DDL (.ddl) or JSON Schema (.json)",
    )
    parser.add_argument("--out", metavar="DIR", help="the table's directory (local, HDFS, ...)")
    parser.add_argument(
        "--quarantine",
        metavar="DIR",
        help="where values that don't fit go (default OUT/_quarantine)",
    )
    parser.add_argument("--once", action="store_true", help="ingest what is there now, then stop")
    parser.add_argument(
        "--compression", choices=["zstd", "snappy", "none"], default="zstd", help="Parquet codec"
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=_count,
        default=5_000_000,
        metavar="N",
        help="records one micro-batch reads at most (default 5,000,000)",
    )
    parser.add_argument(
        "--max-records-per-file",
        type=_count,
        default=1_000_000,
        metavar="N",
        help="rows one Parquet file holds at most (default 1,000,000)",
    )
    parser.add_argument(
        "--trigger-interval",
        dest="trigger_seconds",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="without --once: how often a micro-batch starts (default 60; fewer, bigger files)",
    )
    _add_run_options(parser)
    parser.set_defaults(handler=_lake)


def _lake(args: argparse.Namespace) -> int:
    if not _ready("lake", args, ("bootstrap", "topics", "schema", "out", "checkpoint")):
        return 2
    from kipside.pipeline.lake.job import LakeJob, run_lake

    return run_lake(_job(LakeJob, args))
