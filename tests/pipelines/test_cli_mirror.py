"""Tests for pipeline.cli: `kipside mirror` as the `kipside` command line sees it, through the
`kipside.commands` entry point, in process. Only argument handling: every case here stops
before a cluster or Spark would be needed.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from kipside.pipeline.cli import _size
from kipside.pipeline.lake import job as lake_job
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
        "--group",
        "--commit",
        "--json",
        "{translate}",
    ):
        assert option in out, option
    assert "kipside mirror translate" in out  # the examples


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
    assert err == "kipside mirror: error: --source, --dest, --topics, --checkpoint required\n"


def test_mirror_names_only_the_missing_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "--source", "a:9092", "--topics", "orders")
    assert code == 2
    assert err == "kipside mirror: error: --dest, --checkpoint required\n"


def test_translate_requires_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "translate", "--source", "a:9092", "--dest", "b:9092")
    assert code == 2
    assert err == "kipside mirror translate: error: --group required\n"


def test_translate_does_not_require_the_copy_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mirror", "translate", "--group", "billing")
    assert code == 2
    # --topics and --checkpoint are the copy's, not translate's.
    assert err == "kipside mirror translate: error: --source, --dest required\n"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("mirror", "reverse"), "invalid choice: 'reverse'"),
        (("mirror", "--conf", "novalue"), "'novalue' is not KEY=VALUE"),
        (("mirror", "--timeout", "soon"), "invalid float value: 'soon'"),
        (("mirror", "--sauce"), "unrecognized arguments: --sauce"),
        (("lake", "--max-records-per-file", "0"), "'0' must be positive"),
        (("lake", "--max-offsets-per-trigger", "1e6"), "'1e6' is not a whole number"),
    ],
    ids=["action", "conf", "timeout", "unknown", "count-zero", "count-not-whole"],
)
def test_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err


def started_job(monkeypatch: pytest.MonkeyPatch, module: Any, runner: str, *argv: str) -> object:
    """The job `kipside ARGV...` hands to MODULE.RUNNER (which is replaced, so nothing runs)."""
    started: list[object] = []

    def start(job: object, *_: object) -> int:
        started.append(job)
        return 0

    monkeypatch.setattr(module, runner, start)
    assert main(list(argv)) == 0
    [job] = started
    return job


def test_mirror_options_become_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    job = started_job(
        monkeypatch,
        mirror_job,
        "run_mirror",
        *("mirror", "--source", "a:1", "--dest", "b:2", "--topics", "o.*", "--checkpoint", "c"),
        *("--rename", "x.", "--read-uncommitted", "--max-bytes-per-trigger", "1M", "--once"),
        *("--master", "local[2]", "--no-fail-on-data-loss", "--offset-sync-topic", "syncs"),
        *("--timeout", "2.5", "--conf", "spark.a=1", "--conf", "spark.b=2"),
    )
    assert job == MirrorJob(
        source="a:1",
        dest="b:2",
        topics="o.*",
        checkpoint="c",
        rename="x.",
        read_uncommitted=True,
        max_bytes_per_trigger=1 << 20,
        once=True,
        master="local[2]",
        fail_on_data_loss=False,
        sync_topic="syncs",
        timeout_ms=2500,
        conf={"spark.a": "1", "spark.b": "2"},
    )


def test_mirror_defaults_become_the_jobs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    required = ("--source", "a:1", "--dest", "b:2", "--topics", "o", "--checkpoint", "c")
    job = started_job(monkeypatch, mirror_job, "run_mirror", "mirror", *required)
    assert job == MirrorJob(source="a:1", dest="b:2", topics="o", checkpoint="c")


def test_translate_options_become_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    job = started_job(
        monkeypatch,
        translate,
        "run_translate",
        *("mirror", "translate", "--source", "a:1", "--dest", "b:2", "--group", "g"),
        *("--offset-sync-topic", "syncs", "--commit", "--json", "--timeout", "3"),
    )
    assert job == TranslateJob(
        source="a:1",
        dest="b:2",
        group="g",
        sync_topic="syncs",
        commit=True,
        as_json=True,
        timeout_ms=3000,
    )


def test_lake_options_become_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    job = started_job(
        monkeypatch,
        lake_job,
        "run_lake",
        *("lake", "--bootstrap", "k:1", "--topics", "t", "--schema", "s.json", "--out", "o"),
        *("--checkpoint", "c", "--quarantine", "q", "--once", "--compression", "snappy"),
        *("--master", "local[1]", "--max-offsets-per-trigger", "7", "--max-records-per-file", "8"),
        *("--trigger-interval", "9.5", "--no-fail-on-data-loss", "--timeout", "1"),
    )
    assert job == LakeJob(
        bootstrap="k:1",
        topics="t",
        schema="s.json",
        out="o",
        checkpoint="c",
        quarantine="q",
        once=True,
        compression="snappy",
        master="local[1]",
        max_offsets_per_trigger=7,
        max_records_per_file=8,
        trigger_seconds=9.5,
        fail_on_data_loss=False,
        timeout_ms=1000,
    )
