"""The conventions every `kipside` subcommand's arguments follow, in one parser class.

`KipsideParser` is the class of the `kipside` parser, and argparse makes every subcommand's
parser of its parent's class, so the commands other packages register (`mirror`, `lake`,
`pcap`, through the `kipside.commands` entry points) follow the same conventions without
importing this module:
- `--help` shows every option's default (unless its help text already states it);
- an option nobody knows is named in the error, with the nearest known one, even where
  argparse would otherwise complain about the word after it (`kipside mirror --sourse x`);
- every usage error exits with status 2 (argparse's own convention).
It knows nothing of Kafka and must never start anything.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["KipsideParser", "UsageError"]


class UsageError(ValueError):
    """A command line kipside can't act on; printed as one line, exit status 2."""


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with each option's default appended where its help doesn't say it.

    A description or epilog of one paragraph is wrapped to the terminal; one with line breaks
    (examples) is printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not _shows_default(action):
            return text
        shown = action.default
        if isinstance(shown, float) and shown.is_integer():
            shown = int(shown)
        return f"{text} (default: {str(shown).replace('%', '%%')})"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    if isinstance(action, argparse._HelpAction | argparse._VersionAction):
        return False
    if default is None or default is argparse.SUPPRESS or default in ([], ""):
        return False
    # A flag's default is that it is off, which its help says by being a flag.
    return not (isinstance(default, bool) and action.nargs == 0)


class KipsideParser(argparse.ArgumentParser):
    """An ArgumentParser with kipside's help format and unknown-option errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = _HelpFormatter
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        # A subcommand's parser answers for its own options: an unknown one is named here,
        # with this parser's options to suggest, not by the top parser, which knows none.
        unknown = [token for token in extras if token.startswith("-") and token != "-"]
        if unknown and self._is_subcommand:
            self.error(self._unknown_option(unknown[0]))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        # argparse reads `--sourse x` as an unknown option followed by a positional (a
        # subcommand's name, say) and complains about the positional; the option is the news.
        for token in self._own_tokens():
            if token.startswith("--") and self._known(token) is False:
                message = self._unknown_option(token)
                break
        super().error(message)

    @property
    def _is_subcommand(self) -> bool:
        return " " in self.prog

    def _own_tokens(self) -> list[str]:
        """The tokens this parser reads itself: up to its subcommand's name, if it has one."""
        names = {name for action in self._subparsers_actions() for name in action.choices}
        tokens = []
        for token in self._given:
            if token == "--" or token in names:
                break
            tokens.append(token)
        return tokens

    def _subparsers_actions(self) -> list[argparse._SubParsersAction[Any]]:
        return [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]

    def _option_names(self) -> list[str]:
        return [name for name in self._option_string_actions if name.startswith("--")]

    def _known(self, token: str) -> bool:
        name = token.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        # argparse accepts a unique prefix of a long option.
        return len([o for o in self._option_names() if o.startswith(name)]) == 1

    def _unknown_option(self, token: str) -> str:
        name = token.split("=", 1)[0]
        close = difflib.get_close_matches(name, self._option_names(), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"unrecognized option {name}{hint} (`{self.prog} --help` lists them)"
