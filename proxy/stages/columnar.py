"""The columnar stage: Produce to columnar topics as carriers, their Fetch answers back as the
producers' batches (core.columnar says how, docs/columnar.md what users see).

In the pipeline only while a topic rule is columnar, after principals (what a principal may
not send is refused first) and before the stages that route a ProduceRequest (they carry the
carriers as they would the client's batches). A ProduceRequest with batches to convert is a
`Convert`: the encoding runs off the event loop and the request goes on narrowed to its
carriers. A Fetch goes on unchanged, its answer marked for conversion (`convert`), which the
session runs off the event loop when the answer holds records of a columnar topic.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import ClassVar

from kipside.protocol import ApiKey
from kipside.proxy.core.columnar import ColumnarTopics, warm_up
from kipside.proxy.core.decisions import ClientRequest, Convert, Decision, Narrow
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import RuleSet

__all__ = ["ColumnarStage"]

log = logging.getLogger("kipside.columnar")


class ColumnarStage:
    api_keys: ClassVar[frozenset[int]] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
    """The only requests the stage is asked about. Fetch's cap at v12 while a topic is columnar
    is the versions policy's (ApiVersions answers), not this stage's."""

    def __init__(self, rules: Callable[[], RuleSet], stats: Stats) -> None:
        self.rules = rules
        self.topics = ColumnarTopics(stats.columnar)
        self._warming: threading.Thread | None = None

    def warm_up(self) -> None:
        """Load the codec in a thread of its own, once, when the rules first name a columnar
        topic (at start or on a reload), before a client's batch needs it."""
        if self._warming is None:
            self._warming = threading.Thread(target=_warm_up, name="columnar warm-up", daemon=True)
            self._warming.start()

    def __call__(self, request: ClientRequest) -> Decision | None:
        header = request.header
        key = header.api_key
        if key == ApiKey.PRODUCE:
            rules = self.rules()
            work = self.topics.produce_work(
                rules,
                request.frame,
                header,
                rules.limits.decode_limits,
                request.client.describe,
            )
            return None if work is None else Convert(work, self)
        if key == ApiKey.FETCH:
            convert = self.topics.fetch_convert(self.rules(), request.frame, header)
            return None if convert is None else Narrow(request.frame, convert=convert)
        return None


def _warm_up() -> None:
    try:
        log.info("columnar codec loaded in %.1f s", warm_up())
    except Exception:  # a broken install: the first batch will say so, in its client's terms
        log.exception("loading the columnar codec failed")
