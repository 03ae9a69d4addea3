"""Tests for pipeline.cli: `kipside mirror` as the `kipside` command line sees it, through the
`kipside.commands` entry point, in process. Only argument handling: every case here stops
before a cluster or Spark would be needed.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from kipside.pipeline.cli import _size
from kipside.pipeline.lake import compact
from kipside.pipeline.lake import job as lake_job
from kipside.pipeline.lake.compact import CompactJob
from kipside.pipeline.lake.job import LakeJob
from kipside.pipeline.mirror import job as mirror_job
from kipside.pipeline.mirror import translate
from kipside.pipeline.mirror.job import MirrorJob
from kipside.pipeline.mirror.translate import TranslateJob
from kipside.proxy.cli import main

REQUIRED = "--source", "--dest", "--topics", "--checkpoint"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `kipside ARGV...`."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: --help, usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_mirror_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mirror", "--help")
    assert code == 0
    for option in (
        *REQUIRED,
        "--rename",
        "--read-uncommitted",
        "--max-bytes-per-trigger",
        "--once",
        "--master",
        "--no-fail-on-data-loss",
        "--offset-sync-topic",
        "--timeout",
        "--conf",
        "{translate}",
    ):
        assert option in out, option
    assert "kipside mirror translate" in out  # the examples


def test_translate_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mirror", "translate", "--help")
    assert code == 0
    for option in (
        "--source",
        "--dest",
        "--group",
        "--offset-sync-topic",
        "--commit",
        "--json",
        "--timeout",
    ):
        assert option in out, option


def test_mirror_is_a_kipside_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "mirror" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("256M", 256 << 20),
        ("256m", 256 << 20),
        ("256MiB", 256 << 20),
        ("256MB", 256 << 20),
        ("1G", 1 << 30),
        (" 1g ", 1 << 30),
        ("1.5K", 1536),
        ("64k", 65536),
        ("1e3", 1000),
    ],
)
def test_size(text: str, expected: int) -> None:
    assert _size(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("junk", "is not a size"),
        ("", "is not a size"),
        ("M", "is not a size"),
        ("12X", "is not a size"),
        ("1.5.5K", "is not a size"),
        ("nan", "is not a size"),
        ("0", "must be positive"),
        ("-1M", "must be positive"),
        ("0.1", "must be positive"),
    ],
)
def test_size_rejects(text: str, fragment: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        _size(text)


@pytest.mark.parametrize("text", ["inf", "1e400", "infG"])
def test_size_rejects_infinity(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _size(text)


def test_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "--max-bytes-per-trigger", "lots")
    assert code == 2
    assert "--max-bytes-per-trigger" in err
    assert "'lots' is not a size like 268435456, 256M or 1G" in err


def test_mirror_without_options_names_every_required_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "mirror")
    assert code == 2
    assert out == ""
    assert err.startswith("usage: kipside mirror --source")
    assert err.endswith(
        "kipside mirror: error: the following arguments are required: "
        "--source, --dest, --topics, --checkpoint\n"
    )


def test_mirror_names_only_the_missing_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "--source", "a:9092", "--topics", "orders")
    assert code == 2
    assert err.endswith(
        "kipside mirror: error: the following arguments are required: --dest, --checkpoint\n"
    )


def test_translate_requires_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "translate", "--source", "a:9092", "--dest", "b:9092")
    assert code == 2
    assert err.endswith(
        "kipside mirror translate: error: the following arguments are required: --group\n"
    )


def test_translate_does_not_require_the_copy_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "translate", "--group", "billing")
    assert code == 2
    # --topics and --checkpoint are the copy's, not translate's.
    assert err.endswith(
        "kipside mirror translate: error: the following arguments are required: --source, --dest\n"
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("mirror", "reverse"), "invalid choice: 'reverse'"),
        (("mirror", "--conf", "novalue"), "'novalue' is not KEY=VALUE"),
        (("mirror", "--timeout", "soon"), "invalid float value: 'soon'"),
        (("mirror", "--sauce"), "unrecognized option --sauce; did you mean --source?"),
        (("lake", "--max-records-per-file", "0"), "'0' must be positive"),
        (("lake", "--max-offsets-per-trigger", "1e6"), "'1e6' is not a whole number"),
        (("lake", "--target-file-size", "0"), "argument --target-file-size: '0' must be positive"),
        (("lake", "--target-file-size", "128MeB"), "'128MeB' is not a size like 268435456"),
    ],
    ids=[
        "action",
        "conf",
        "timeout",
        "unknown",
        "count-zero",
        "count-not-whole",
        "size-zero",
        "size-not-a-size",
    ],
)
def test_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err


# What each command needs before it starts, the module it starts the job in, and the job
# those required options alone make (every other field at the job's default).
COMMANDS: dict[str, tuple[tuple[str, ...], Any, str, object]] = {
    "mirror": (
        ("mirror", "--source", "a:1", "--dest", "b:2", "--topics", "o", "--checkpoint", "c"),
        mirror_job,
        "run_mirror",
        MirrorJob(source="a:1", dest="b:2", topics="o", checkpoint="c"),
    ),
    "translate": (
        ("mirror", "translate", "--source", "a:1", "--dest", "b:2", "--group", "g"),
        translate,
        "run_translate",
        TranslateJob(source="a:1", dest="b:2", group="g", sync_topic="kipside-mirror-offset-syncs"),
    ),
    "lake": (
        (
            "lake",
            "--bootstrap",
            "k:1",
            "--topics",
            "t",
            "--schema",
            "s",
            "--out",
            "o",
            "--checkpoint",
            "c",
        ),
        lake_job,
        "run_lake",
        LakeJob(bootstrap="k:1", topics="t", schema="s", out="o", checkpoint="c"),
    ),
    "compact": (
        ("lake", "compact", "--format", "iceberg", "--out", "o"),
        compact,
        "run_compact",
        CompactJob(out="o", format="iceberg"),
    ),
}


def started_job(monkeypatch: pytest.MonkeyPatch, command: str, *argv: str) -> object:
    """The job `kipside COMMAND... ARGV...` starts (its runner is replaced, so nothing runs)."""
    required, module, runner, _ = COMMANDS[command]
    started: list[object] = []

    def start(job: object, *_: object) -> int:
        started.append(job)
        return 0

    monkeypatch.setattr(module, runner, start)
    assert main([*required, *argv]) == 0
    [job] = started
    return job


@pytest.mark.parametrize("command", COMMANDS)
def test_required_options_alone_make_a_job_of_defaults(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # The CLI's defaults are the job's: --timeout 60 is timeout_ms=60000 and so on.
    expected = COMMANDS[command][3]
    if hasattr(expected, "timeout_ms"):  # `lake compact` talks to no cluster
        expected = dataclasses.replace(expected, timeout_ms=60_000)  # type: ignore[type-var]
    assert started_job(monkeypatch, command) == expected


# (command, options, the job field they set, its value)
OPTION_FIELDS = [
    ("mirror", ("--rename", "x."), "rename", "x."),
    ("mirror", ("--read-uncommitted",), "read_uncommitted", True),
    ("mirror", ("--max-bytes-per-trigger", "1M"), "max_bytes_per_trigger", 1 << 20),
    ("mirror", ("--once",), "once", True),
    ("mirror", ("--master", "local[2]"), "master", "local[2]"),
    ("mirror", ("--no-fail-on-data-loss",), "fail_on_data_loss", False),
    ("mirror", ("--offset-sync-topic", "syncs"), "sync_topic", "syncs"),
    ("mirror", ("--timeout", "2.5"), "timeout_ms", 2500),
    (
        "mirror",
        ("--conf", "spark.a=1", "--conf", "spark.b=2"),
        "conf",
        {"spark.a": "1", "spark.b": "2"},
    ),
    ("translate", ("--offset-sync-topic", "syncs"), "sync_topic", "syncs"),
    ("translate", ("--commit",), "commit", True),
    ("translate", ("--json",), "as_json", True),
    ("translate", ("--timeout", "3"), "timeout_ms", 3000),
    ("lake", ("--quarantine", "q"), "quarantine", "q"),
    ("lake", ("--once",), "once", True),
    ("lake", ("--compression", "snappy"), "compression", "snappy"),
    ("lake", ("--master", "local[1]"), "master", "local[1]"),
    ("lake", ("--max-offsets-per-trigger", "7"), "max_offsets_per_trigger", 7),
    ("lake", ("--max-records-per-file", "8"), "max_records_per_file", 8),
    ("lake", ("--target-file-size", "64MiB"), "target_file_size", 64 << 20),
    ("lake", ("--target-file-size", "64MB"), "target_file_size", 64 << 20),
    ("lake", ("--target-file-size", "1048576"), "target_file_size", 1 << 20),
    ("compact", ("--target-file-size", "256KiB"), "target_file_size", 256 << 10),
    ("compact", ("--before", "2026-11-20"), "before", "2026-11-20"),
    ("compact", ("--table", "a.b"), "table", "a.b"),
    ("compact", ("--quarantine", "a.q"), "quarantine", "a.q"),
    ("compact", ("--catalog", "sqlite:////c.db"), "catalog", "sqlite:////c.db"),
    ("lake", ("--trigger-interval", "9.5"), "trigger_seconds", 9.5),
    ("lake", ("--no-fail-on-data-loss",), "fail_on_data_loss", False),
    ("lake", ("--timeout", "1"), "timeout_ms", 1000),
    ("lake", ("--conf", "spark.x=y"), "conf", {"spark.x": "y"}),
]


@pytest.mark.parametrize(("command", "argv", "field", "value"), OPTION_FIELDS)
def test_each_option_sets_its_job_field(
    monkeypatch: pytest.MonkeyPatch, command: str, argv: tuple[str, ...], field: str, value: Any
) -> None:
    job = started_job(monkeypatch, command, *argv)
    assert getattr(job, field) == value
    # ...and nothing else: the job is the required options' job with that one field changed.
    base = started_job(monkeypatch, command)
    assert job == dataclasses.replace(base, **{field: value})  # type: ignore[type-var]
