"""Makes `spark.read.format("kipside")` work with no registration call.

Spark looks for installed top-level modules named `pyspark_*` that define `DefaultSource`
(pyspark/sql/worker/lookup_data_sources.py) when a session first uses a Python data source.
This shim is the only generic top-level name kipside installs for that; the source itself is
kipside.pipeline.source.datasource.
"""

from kipside.pipeline import KipsideDataSource as DefaultSource

__all__ = ["DefaultSource"]
