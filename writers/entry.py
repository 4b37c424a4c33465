"""The writer's own command line: its arguments and how it runs, for
`icekeeper writer` and for `spark-submit writers/__main__.py` alike
(a role's entry point does not go through another package)."""

from __future__ import annotations

import argparse
import json
import sys

from icekeeper.common.config import load_config
from icekeeper.common.exit_codes import OK, USAGE
from icekeeper.common.logs import use_configured_level


def add_writer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--writer-id", default=None, help="stable id of this writer (default: writer.writer_id)"
    )
    parser.add_argument("--once", action="store_true", help="one batch with records, then exit")
    parser.add_argument("--max-batches", type=int, default=None)
    parser.add_argument(
        "--until-idle", action="store_true", help="exit when a batch finds nothing new"
    )
    parser.add_argument(
        "--spark-packages",
        action="store_true",
        help="print the --packages value for spark-submit and exit",
    )
    parser.add_argument(
        "--executor-env",
        action="store_true",
        help="build (or reuse from the cache) the packed Python environment Spark executors run "
        "the writer's tasks in, print its path (for spark-submit --archives PATH#environment) "
        "and exit",
    )


def run_writer(args: argparse.Namespace) -> int:
    """Run batches until stopped (or as `--once`, `--max-batches`, `--until-idle` say), one JSON
    line per batch."""
    if args.spark_packages:
        from icekeeper.common.spark import spark_submit_packages

        print(spark_submit_packages(load_config(args.config)))
        return OK
    if args.executor_env:
        from pathlib import Path

        from icekeeper.common.executor_env import packed_env

        def progress(message: str) -> None:
            print(message, file=sys.stderr, flush=True)  # stdout holds the path alone

        print(packed_env(Path(load_config(args.config).cache_dir), progress).archive.resolve())
        return OK
    from icekeeper.writers.job import WriterJob
    from icekeeper.writers.offsets import TopicReset

    config = load_config(args.config)
    use_configured_level(config.log_level)
    job = WriterJob(config, writer_id=args.writer_id)
    job.install_signal_handlers()

    def show(report) -> None:  # noqa: ANN001 - BatchReport
        if report.paused:
            print(json.dumps({"paused": report.paused}), flush=True)
            return
        print(
            json.dumps(
                {
                    "batch": report.seq,
                    "records": report.records_read,
                    "rows": report.rows_written,
                    "files": report.files,
                    "monikers": report.monikers,
                    "dead_lettered": report.dead_lettered,
                    "lost_to_retention": report.lost_to_retention,
                    "seconds": round(report.seconds, 2),
                }
            ),
            flush=True,
        )

    try:
        job.run(
            max_batches=1 if args.once else args.max_batches,
            until_idle=args.until_idle,
            on_batch=show,
        )
    except TopicReset as reset:
        print(f"error: {reset}", file=sys.stderr, flush=True)
        return USAGE  # the config must say what to do: sources[].on_topic_reset
    return OK
