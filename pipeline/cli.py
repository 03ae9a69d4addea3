"""`kipside mirror` (and its `translate`) and `kipside lake`: the pipeline's commands, registered
on the `kipside` command line through the `kipside.commands` entry point group.

This module only parses arguments and hands over to pipeline.mirror; it must stay cheap to
import (no pyspark here), because `kipside serve` loads it to build its parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import re
import sys
from functools import partial
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
at least once across restarts (exactly once with --exactly-once). See docs/mirror.md.
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


def _day(text: str) -> str:
    """A calendar day, YYYY-MM-DD."""
    try:
        return dt.date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date like 2026-11-28") from None


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _topics(text: str) -> str:
    """A regular expression over whole topic names, checked before anything starts."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None
    return text


def _properties(text: str) -> Any:
    """A Kafka client property file, read and checked now (a mistake is a usage error)."""
    from kipside.pipeline.kafka.properties import PropertiesError, load_properties

    try:
        return load_properties(text)
    except PropertiesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _count(text: str) -> int:
    """A positive whole number."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _add_run_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """What every Spark job command takes about running: where its progress is kept, Spark,
    data loss, retry time and Spark configuration."""
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        required=required,
        help="Spark checkpoint (progress) directory (required)",
    )
    parser.add_argument("--master", default="local[*]", metavar="URL", help="Spark master URL")
    parser.add_argument(
        "--no-fail-on-data-loss",
        dest="fail_on_data_loss",
        action="store_false",
        help="skip offsets deleted before they were read, instead of failing "
        "(failOnDataLoss=false)",
    )
    _add_timeout_option(parser)
    parser.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )


def _add_timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to keep retrying an unreachable cluster",
    )


def _add_config(parser: argparse.ArgumentParser, flag: str, which: str) -> None:
    parser.add_argument(
        flag,
        type=_properties,
        metavar="FILE",
        help=f"Kafka client properties of the {which} cluster (security.protocol, sasl.*, "
        "ssl.*, bootstrap.servers, client.id), as the Kafka tools take them",
    )


def _add_clusters(parser: argparse.ArgumentParser) -> None:
    # Checked in the handlers (_bootstraps): a bootstrap may come from the property file, and
    # argparse would demand them of `mirror translate` too.
    parser.add_argument(
        "--source",
        metavar="HOST:PORT[,...]",
        help="source cluster bootstrap (required, unless --source-config gives bootstrap.servers)",
    )
    parser.add_argument(
        "--dest",
        metavar="HOST:PORT[,...]",
        help="destination cluster bootstrap (required, unless --dest-config gives "
        "bootstrap.servers)",
    )
    _add_config(parser, "--source-config", "source")
    _add_config(parser, "--dest-config", "destination")


def _bootstraps(args: argparse.Namespace, *pairs: tuple[str, str]) -> None:
    """A bootstrap flag left out takes the bootstrap.servers of its property file (a flag
    given wins, as with the Kafka tools' --bootstrap-server)."""
    for flag, config in pairs:
        properties = getattr(args, config, None)
        if not getattr(args, flag) and properties is not None:
            setattr(args, flag, properties.bootstrap)


def _add_sync_topic(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument(
        "--offset-sync-topic", dest="sync_topic", default=DEFAULT_TOPIC, metavar="TOPIC", help=help
    )


_MIRROR_USAGE = """\
kipside mirror --source HOST:PORT[,...] --dest HOST:PORT[,...] --topics REGEX --checkpoint DIR
                      [options]
       kipside mirror translate --source HOST:PORT[,...] --dest HOST:PORT[,...] --group GROUP
                      [options]"""


def register_mirror(sub: Any) -> None:
    parser = sub.add_parser(
        "mirror",
        help="copy topics between clusters as raw record batches (a Spark job)",
        description="Copy topics between Kafka clusters batch for batch, never decompressing "
        "them, as a Spark Structured Streaming job (KIP-712's shallow mirror).",
        usage=_MIRROR_USAGE,
        epilog=_MIRROR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_clusters(parser)
    parser.add_argument(
        "--topics",
        type=_topics,
        metavar="REGEX",
        help="source topics to copy, a regular expression over whole names (required)",
    )
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
        "--exactly-once",
        action="store_true",
        help="copy each partition's batches of a micro-batch in a Kafka transaction with their "
        "offset syncs and progress: read_committed consumers see every record once, across "
        "crashes",
    )
    _add_sync_topic(
        parser, "compacted topic on the destination recording where batches landed ('' for none)"
    )
    parser.add_argument(
        "--sync-groups",
        type=_topics,
        metavar="REGEX",
        help="while copying, commit the translated offsets of the source consumer groups whose "
        "whole name matches to the same groups on the destination (never backwards, never a "
        "group with active members there)",
    )
    parser.add_argument(
        "--sync-groups-interval",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how often --sync-groups syncs at most",
    )
    _add_run_options(parser, required=False)
    parser.set_defaults(handler=partial(_mirror, parser))
    commands = parser.add_subparsers(dest="mirror_command", metavar="{translate}")
    _register_translate(commands, prog=f"{parser.prog} translate")


_TRANSLATE_EPILOG = """\
example:
  kipside mirror translate --source src:9092 --dest dst:9092 --group billing --commit

Prints, per partition, where the group's consumers resume on the destination. --commit needs
the group to have no active members on the destination. See docs/mirror.md.
"""


def _register_translate(sub: Any, *, prog: str) -> None:
    parser = sub.add_parser(
        "translate",
        prog=prog,
        help="a consumer group's source offsets, as destination offsets (for failover)",
        description="Translate a consumer group's committed offsets on the source into "
        "offsets on the destination, from the offset syncs the mirror wrote; optionally "
        "commit them there.",
        usage=f"{prog} --source HOST:PORT[,...] --dest HOST:PORT[,...] --group GROUP [options]",
        epilog=_TRANSLATE_EPILOG,
    )
    _add_clusters(parser)
    parser.add_argument("--group", help="the consumer group (required)")
    _add_sync_topic(parser, "the topic on the destination the mirror wrote its offset syncs to")
    parser.add_argument(
        "--commit",
        action="store_true",
        help="commit the translated offsets to the group on the destination",
    )
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print the offsets as JSON"
    )
    _add_timeout_option(parser)
    parser.set_defaults(handler=partial(_translate, parser))


def _pipeline_missing(spark: bool = True) -> str | None:
    """Why the pipeline can't run here, if the `pipeline` extra is not installed."""
    try:
        import pyarrow  # noqa: F401

        if spark:
            import pyspark  # noqa: F401
        else:
            import pyiceberg  # noqa: F401
    except ImportError as exc:
        return (
            f"{exc.name} is not installed: the pipelines need kipside's pipeline extra "
            "(pip install 'kipside[pipeline]') and Java 17 for Spark"
        )
    return None


def _require(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """argparse's own error (usage, exit status 2) for required options left out, for a
    command whose parser can't declare them required."""
    missing = [f"--{name.replace('_', '-')}" for name in names if not getattr(args, name)]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")


def _ready(command: str, spark: bool = True) -> bool:
    """Whether `kipside COMMAND` can start: the pipeline extra is installed. If not, says
    why on stderr."""
    problem = _pipeline_missing(spark)
    if problem is not None:
        print(f"kipside {command}: error: {problem}", file=sys.stderr)
    return problem is None


def _job(cls: type[_Job], args: argparse.Namespace) -> _Job:
    """The job the command line describes: each option's dest is the name of the job's field it
    sets, and the run options give timeout_ms and conf."""
    given = vars(args) | {"conf": dict(getattr(args, "conf", []))}
    if "timeout" in given:
        given["timeout_ms"] = int(args.timeout * 1000)
    if "catalog_properties" in given:
        given["catalog_properties"] = dict(args.catalog_properties)
    return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})


def _translate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _bootstraps(args, ("source", "source_config"), ("dest", "dest_config"))
    _require(parser, args, "source", "dest", "group")
    if not _ready("mirror translate"):
        return 2
    from kipside.pipeline.mirror.translate import TranslateJob, run_translate

    return run_translate(_job(TranslateJob, args), sys.stdout, sys.stderr)


def _mirror(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _bootstraps(args, ("source", "source_config"), ("dest", "dest_config"))
    _require(parser, args, "source", "dest", "topics", "checkpoint")
    if args.sync_groups and not args.sync_topic:
        parser.error(
            "--sync-groups translates through the offset syncs: --offset-sync-topic '' "
            "turns them off"
        )
    if not _ready("mirror"):
        return 2
    from kipside.pipeline.mirror.job import MirrorJob, run_mirror

    return run_mirror(_job(MirrorJob, args))


def _add_catalog_options(parser: argparse.ArgumentParser, when: str = "") -> None:
    """Where an Iceberg lake's tables are: the options `lake` and `lake compact` share;
    `when` starts their help (`lake` takes them with --format iceberg only)."""
    parser.add_argument(
        "--catalog",
        metavar="URL",
        help=f"{when}the Iceberg catalog, sqlite:///FILE (a SQL catalog; default "
        "OUT/catalog.db) or the http(s) URL of a REST catalog",
    )
    parser.add_argument(
        "--catalog-property",
        dest="catalog_properties",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{when}a pyiceberg catalog property (credential, token, warehouse, ...), repeatable",
    )
    parser.add_argument(
        "--table",
        default="kipside.lake",
        metavar="NAMESPACE.NAME",
        help=f"{when}the records table (default kipside.lake)",
    )


def _add_target_file_size(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument(
        "--target-file-size",
        type=_size,
        default=128 << 20,
        metavar="SIZE",
        help=help,
    )


_LAKE_EPILOG = """\
example:
  kipside lake --bootstrap kafka:9092 --topics 'orders|payments' --schema orders.json \\
      --out /data/lake --checkpoint /data/lake-checkpoint --once

Each record's JSON value becomes a row of the schema's columns; values that don't fit go to
quarantine with the reason. Exactly once across restarts. See docs/lake.md.
"""


_LAKE_USAGE = """\
kipside lake --bootstrap HOST:PORT[,...] --topics REGEX --schema FILE --out DIR
                    --checkpoint DIR [options]"""


def register_lake(sub: Any) -> None:
    parser = sub.add_parser(
        "lake",
        help="write topics to Parquet or Iceberg through a JSON schema (a Spark job)",
        description="Ingest Kafka topics into Parquet or Iceberg tables: JSON values decoded into "
        "typed columns, partitioned by topic and date, exactly once (KIP-1008's ingestion "
        "consumer).",
        usage=_LAKE_USAGE,
        epilog=_LAKE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap brokers (required, unless --source-config gives bootstrap.servers)",
    )
    _add_config(parser, "--source-config", "Kafka")
    parser.add_argument(
        "--topics",
        type=_topics,
        metavar="REGEX",
        help="topics to ingest, a regular expression over whole names (required)",
    )
    parser.add_argument(
        "--schema",
        metavar="FILE",
        help="the values' schema: Spark DDL (.ddl) or JSON Schema (.json) (required)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="the table's directory (local, HDFS, ...) (required)",
    )
    parser.add_argument(
        "--quarantine",
        metavar="DIR|TABLE",
        help="where values that don't fit go (default OUT/_quarantine; with --format iceberg, "
        "the table TABLE_quarantine)",
    )
    parser.add_argument(
        "--format",
        choices=["parquet", "iceberg"],
        default="parquet",
        help="plain Parquet files under OUT (default), or Iceberg tables committed with their "
        "Kafka offsets",
    )
    _add_catalog_options(parser, "with --format iceberg: ")
    parser.add_argument(
        "--columnar-key-file",
        metavar="FILE",
        help="the key file of columnar topics' encrypted fields (a columnar rule's key_file); "
        "without it such a topic stops the job",
    )
    parser.add_argument("--once", action="store_true", help="ingest what is there now, then stop")
    parser.add_argument(
        "--compression",
        choices=["zstd", "snappy", "none"],
        default="zstd",
        help="the Parquet files' compression codec",
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
    _add_target_file_size(
        parser,
        "about how big a Parquet file grows before the next one starts, like 128MiB, 64M or "
        "1048576 (default 128MiB)",
    )
    parser.add_argument(
        "--trigger-interval",
        dest="trigger_seconds",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="without --once: how often a micro-batch starts (default 60; fewer, bigger files)",
    )
    _add_run_options(parser, required=False)
    parser.set_defaults(handler=partial(_lake, parser))
    commands = parser.add_subparsers(dest="lake_command", metavar="{compact}")
    _register_compact(commands, prog=f"{parser.prog} compact")


_COMPACT_EPILOG = """\
example:
  kipside lake compact --format iceberg --out /data/lake

Rewrites the small files of the partitions of days before today (UTC) into files of about
--target-file-size, in one snapshot per table (records and quarantine). Safe while
`kipside lake` ingests into the same tables: no row is lost or repeated. Needs no Spark.
See docs/lake.md.
"""


def _register_compact(sub: Any, *, prog: str) -> None:
    parser = sub.add_parser(
        "compact",
        prog=prog,
        help="rewrite an Iceberg lake's small files of past days into bigger ones",
        description="Rewrite the small data files of an Iceberg lake's closed partitions (days "
        "before today, UTC) into files of about the target size, one snapshot per table.",
        usage=f"{prog} --format iceberg --out DIR [options]",
        epilog=_COMPACT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="the --out of the `kipside lake` that made the tables (required)",
    )
    parser.add_argument(
        "--format",
        choices=["parquet", "iceberg"],
        default="parquet",
        help="the lake's format, as given to `kipside lake`: only iceberg can be compacted",
    )
    _add_catalog_options(parser)
    parser.add_argument(
        "--quarantine",
        metavar="TABLE",
        help="the quarantine table (default TABLE_quarantine)",
    )
    _add_target_file_size(
        parser, "about how big the rewritten files are, like 128MiB, 64M (default 128MiB)"
    )
    parser.add_argument(
        "--before",
        type=_day,
        metavar="YYYY-MM-DD",
        help="compact the partitions of days before this one (default today, UTC)",
    )
    parser.set_defaults(handler=partial(_compact, parser))


def _compact(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _require(parser, args, "out")
    if not _ready("lake compact", spark=False):
        return 2
    from kipside.pipeline.lake.compact import CompactJob, run_compact

    return run_compact(_job(CompactJob, args), sys.stdout, sys.stderr)


def _lake(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _bootstraps(args, ("bootstrap", "source_config"))
    _require(parser, args, "bootstrap", "topics", "schema", "out", "checkpoint")
    if not _ready("lake"):
        return 2
    from kipside.pipeline.lake.job import LakeJob, run_lake

    return run_lake(_job(LakeJob, args))
