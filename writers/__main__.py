"""Entry point for `spark-submit`: `spark-submit --packages ... writers/__main__.py --config C`.

The default `arrow` engine runs Python tasks in every executor, which need `icekeeper[executor]`:
ship it with `--archives "$(icekeeper writer --executor-env)#environment"` and
`PYSPARK_PYTHON=./environment/bin/python`, or `spark.executor_env: packed`
(docs/operations.md, "Writers on a Spark cluster"); `spark-sql` runs no Python there.
"""

import argparse
import sys

from icekeeper.common.config import ConfigError
from icekeeper.common.exit_codes import USAGE, UsageError
from icekeeper.common.logs import LOG_LEVELS, configure_logging
from icekeeper.writers.entry import add_writer_arguments, run_writer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="writers", description="an icekeeper writer: Kafka batches -> Parquet files + monikers"
    )
    parser.add_argument(
        "--config",
        "-c",
        default=None,
        help="YAML or seed-000 .properties file (default: embedded defaults)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging (-v info, -vv debug); JSON lines on stderr",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=None,
        help="log level (wins over -v; default: the config's log_level)",
    )
    add_writer_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.log_level)
    try:
        return run_writer(args)
    except (ConfigError, UsageError) as error:
        print(error, file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
