"""The `kipside` command line as a user meets it: --version, every subcommand's help, usage
errors (each names what was wrong and exits with status 2), in process. The mirror's own
argument cases are in tests/pipelines/test_cli_mirror.py; what the sidecar says about an
upstream that is not Kafka is in tests/test_cli_upstream.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from kipside.proxy.cli import build_parser, main
from kipside.proxy.server import ServerConfig


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `kipside ARGV...`."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def parsers(
    parser: argparse.ArgumentParser | None = None,
) -> Iterator[argparse.ArgumentParser]:
    """The `kipside` parser and every subcommand's, depth first."""
    parser = parser or build_parser()
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from parsers(sub)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out == f"kipside {version('kipside')}\n"


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("serve", "dev", "rules", "credentials", "mirror", "lake", "pcap"):
        assert f"\n    {command} " in out or f"\n    {command}\n" in out, command
    assert "serve, dev, rules check, and credentials add" not in out


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"{parser.prog} {action.option_strings or action.dest}"
        for parser in parsers()
        for action in options(parser)
        if not action.help
    ]
    assert missing == []


def test_every_default_is_in_the_help() -> None:
    """An option with a default says it in --help, by argparse or in its own words."""
    silent = []
    for parser in parsers():
        text = parser.format_help()
        for action in options(parser):
            if action.default in (None, False, [], "", argparse.SUPPRESS):
                continue
            if isinstance(action, argparse._VersionAction) or action.nargs == 0:
                continue  # a flag: its help says what turning it on does
            start = text.index("\n  " + action.option_strings[0]) + 1
            entry = text[start:].split("\n  -", 1)[0]
            if "default" not in " ".join(entry.split()):
                silent.append(f"{parser.prog} {action.option_strings[-1]}")
    assert silent == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("serve",), "PORT defaults to 9092"),
        (("serve",), "--shutdown-grace SECONDS"),
        (("serve",), "(default: 5)"),
        (("serve",), "--discovery-timeout SECONDS"),
        (("serve",), "(default: 30)"),
        (("dev",), "(default: 127.0.0.1:9092)"),
        (("lake",), "codec (default: zstd)"),
        (("credentials", "add"), "4096-16384 as Apache Kafka allows"),
        (("credentials", "add"), "(default: 4096)"),
        (("serve",), "how much kipside logs to stderr"),
        (("rules", "check"), "the YAML rule file"),
    ],
)
def test_help_states(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], said: str) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    assert said in " ".join(out.split()), out


def test_translate_is_a_subcommand_with_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mirror", "translate", "--help")
    assert code == 0
    assert out.startswith("usage: kipside mirror translate ")
    usage = " ".join(out.split("\n\n", 1)[0].split())
    # translate's required options are required in its usage, and the copy's are absent.
    for required in ("--source HOST:PORT[,...]", "--dest HOST:PORT[,...]", "--group GROUP"):
        assert f"[{required}" not in usage and required in usage, required
    for copy_only in ("--topics", "--checkpoint", "--max-bytes-per-trigger", "--master"):
        assert copy_only not in out, copy_only


def test_mirror_help_shows_its_required_options_as_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "mirror", "--help")
    assert code == 0
    first = " ".join(out.split("\n\n", 1)[0].split())
    assert first.startswith(
        "usage: kipside mirror --source HOST:PORT[,...] --dest HOST:PORT[,...] "
        "--topics REGEX --checkpoint DIR [options]"
    )
    listed = out.split("\noptions:\n", 1)[1].split("\nexamples:", 1)[0]
    assert "--group" not in listed and "--commit" not in listed  # translate's options


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("mirror", "--sourse", "x"),
            "kipside mirror: error: unrecognized option --sourse; did you mean --source?",
        ),
        (
            ("mirror", "translate", "--gruop", "g"),
            "kipside mirror translate: error: unrecognized option --gruop; did you mean --group?",
        ),
        (
            ("serve", "--upstream", "a", "--listne", "b"),
            "kipside serve: error: unrecognized option --listne; did you mean --listen?",
        ),
        (
            ("lake", "--chekpoint=/x"),
            "kipside lake: error: unrecognized option --chekpoint; did you mean --checkpoint?",
        ),
        (
            ("pcap", "summary", "f", "--prot", "1"),
            "unrecognized option --prot; did you mean --port?",
        ),
        (("dev", "--zzz"), "kipside dev: error: unrecognized option --zzz (`kipside dev --help`"),
    ],
    ids=["mirror", "translate", "serve", "equals", "pcap", "no-suggestion"],
)
def test_an_unknown_option_is_named(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], said: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert said in err, err
    assert "invalid choice" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("mirror", "--source", "a:1", "--dest", "b:1", "--checkpoint", "c", "--topics", "("),
            "argument --topics: '(' is not a regular expression: missing )",
        ),
        (("lake", "--topics", "[a"), "argument --topics: '[a' is not a regular expression"),
        (("mirror",), "the following arguments are required: --source, --dest, --topics"),
        (("lake",), "the following arguments are required: --bootstrap, --topics, --schema"),
        (("serve",), "the following arguments are required: --upstream, --listen"),
        (("serve", "--upstream", "a", "--listen", "b", "--discovery-timeout", "0"), "above 0"),
        (("dev", "--shutdown-grace", "-1"), "-1 s: give a number of seconds, 0 or more"),
        (("serve", "--upstream", "a:x", "--listen", "127.0.0.1:1"), "--upstream"),
        (("rules", "check"), "the following arguments are required: file"),
        (("credentials", "add", "f", "u", "--iterations", "5"), "iterations must be between"),
    ],
    ids=[
        "mirror-regex",
        "lake-regex",
        "mirror-required",
        "lake-required",
        "serve-required",
        "discovery-timeout",
        "shutdown-grace",
        "upstream-port",
        "rules-file",
        "iterations",
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    said: str,
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("secret\n"))
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert said in err, err


class _Stdin:
    """A piped standard input (not a terminal) holding `text`."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines(keepends=True)

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        return self._lines.pop(0) if self._lines else ""


def test_discovery_timeout_reaches_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[ServerConfig] = []
    monkeypatch.setattr("kipside.proxy.cli.run", started.append)
    main(["serve", "--upstream", "k:9", "--listen", "127.0.0.1:0", "--discovery-timeout", "2.5"])
    [config] = started
    assert config.discovery_timeout_seconds == 2.5
    assert [str(a) for a in config.upstreams] == ["k:9"]
