"""kipside's data pipelines on Spark: `kipside mirror`, `kipside lake` and format("kipside").

``register_mirror`` and ``register_lake`` add the pipeline commands to the ``kipside`` command
line (through the ``kipside.commands`` entry points); ``KipsideDataSource`` is the Python data
source Spark knows as ``kipside``. It needs the ``pipeline`` extra (PySpark, pyarrow), so it is
imported on first use: ``import kipside.pipeline`` stays cheap for the command line.

This package is a blocking shell over kipside.protocol. It must never import kipside.proxy or
trio (``make lint`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kipside.pipeline.cli import register_lake, register_mirror

if TYPE_CHECKING:
    from kipside.pipeline.source.datasource import KipsideDataSource


def __getattr__(name: str) -> Any:
    if name == "KipsideDataSource":
        from kipside.pipeline.source.datasource import KipsideDataSource

        return KipsideDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KipsideDataSource", "register_lake", "register_mirror"]
