"""kipside's pipeline commands as a spark-submit application.

    spark-submit --master spark://HOST:7077 [spark-submit options] \\
        "$(python -c 'import kipside.pipeline.submit as s; print(s.__file__)')" \\
        mirror --source ... --dest ... --topics ... --checkpoint ...

spark-submit starts the driver's JVM with its own options (--master, --deploy-mode client,
--conf, --driver-memory ...) and runs this file; the arguments after it are those of `kipside
mirror` or `kipside lake`. The session the job then builds keeps spark-submit's master (a
--master given to the command itself is ignored, with a warning) and adds kipside's settings.

This module only parses the command line; it must never import kipside.proxy (the `kipside`
command lives there), so it builds the two commands' parsers itself.
"""

from __future__ import annotations

import argparse
import os
import sys

from kipside.pipeline.cli import register_lake, register_mirror

__all__ = ["UNDER_SPARK_SUBMIT", "main"]

UNDER_SPARK_SUBMIT = "KIPSIDE_UNDER_SPARK_SUBMIT"
"""Set while a job runs under spark-submit: the session keeps spark-submit's master."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kipside (spark-submit)",
        description="kipside mirror or kipside lake, run by spark-submit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{mirror,lake}")
    register_mirror(commands)
    register_lake(commands)
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    if any(a == "--master" or a.startswith("--master=") for a in given):
        print(
            f"kipside {args.command}: warning: --master is spark-submit's under spark-submit; "
            "the command's own --master is ignored",
            file=sys.stderr,
        )
    os.environ[UNDER_SPARK_SUBMIT] = "1"
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
