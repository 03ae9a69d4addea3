"""What the tests of pipeline.source.options share: the smallest valid options (a bootstrap
server and a subscription) and the two ways a test reads options: parse (must succeed) and
error (must raise OptionError; its message). Used by test_options (what a valid read becomes)
and test_options_errors (what a bad one says); it holds no tests.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kipside.pipeline.source.options import OptionError, SourceOptions, parse_source_options

BOOTSTRAP = {"kafka.bootstrap.servers": "broker-1:9092"}
BASE = {**BOOTSTRAP, "subscribe": "orders"}
BASE_A = {**BOOTSTRAP, "subscribe": "a"}


def parse(extra: Mapping[str, str] | None = None, *, streaming: bool = False) -> SourceOptions:
    return parse_source_options({**BASE, **(extra or {})}, streaming=streaming)


def error(options: Mapping[str, str], *, streaming: bool = False) -> str:
    with pytest.raises(OptionError) as info:
        parse_source_options(options, streaming=streaming)
    return str(info.value)
