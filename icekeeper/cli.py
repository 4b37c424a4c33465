"""The `icekeeper` command: parse arguments and hand off to the module that owns the work.

This package (`icekeeper/`) is the composition root: it may import every role (`writers/`,
`bookkeeper/`, `reaper/`) and the development tooling (local stack, sample producers, demo,
benchmarks); the roles never import it.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata as package_metadata
from pathlib import Path
from typing import NoReturn

from icekeeper.common import exit_codes
from icekeeper.common.config import ConfigError, IcekeeperConfig, load_config
from icekeeper.common.config.model import parse_duration_s
from icekeeper.common.logs import LOG_LEVELS, configure_logging, use_configured_level


def _config(args: argparse.Namespace) -> IcekeeperConfig:
    from icekeeper.common.storage import StorageSettings, configure_storage

    config = load_config(args.config)
    use_configured_level(config.log_level)
    # Commands that open no catalog (status, dead-letters) still read the roles' files.
    configure_storage(StorageSettings.from_properties(config.catalog.properties))
    return config


def _development_config(args: argparse.Namespace) -> IcekeeperConfig:
    """The config of a development command (demo, samples, benchmarks, chaos): with no source or
    table of its own, seed 000's on the local stack, so it runs on a fresh machine with no file."""
    from icekeeper.seed_defaults import with_seed_defaults

    return with_seed_defaults(_config(args))


OPTIONAL_SERVICE_NAMES = (
    "mariadb",
    "postgres",
    "connect",
    "kafka-sasl",
    "registry-auth",
    "s3",
    "rest",
    "nessie",
    "hms",
    "pg-catalog",
)
"""What `stack up --with` takes (icekeeper/localstack/stack.py `OPTIONAL_SERVICES`, named here so
that `--help` does not import the stack)."""


def _optional_service_names(text: str) -> list[str]:
    """`--with` names, space- or comma-separated (`--with s3,rest nessie`)."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in OPTIONAL_SERVICE_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"no optional service {', '.join(unknown)}; "
            f"choose from {', '.join(OPTIONAL_SERVICE_NAMES)}"
        )
    return names


def _progress(message: str) -> None:
    print(f"[icekeeper] {message}", flush=True)


def cmd_stack(args: argparse.Namespace) -> int:
    from icekeeper.localstack.stack import LocalStack, started_optional_services

    config = _config(args)
    # Each --with word is a list of names (`s3,rest`).
    with_services = [name for names in args.with_services or [] for name in names]
    if args.action != "up":
        # `down` and `status` also cover the optional services an earlier `up --with` started.
        with_services += [
            name for name in started_optional_services(config) if name not in with_services
        ]
    stack = LocalStack(config, only=args.only, with_services=with_services)
    if args.action == "up":
        report = stack.up(_progress)
        _print_status(stack)
        started = ", ".join(report.started) or "nothing (already running)"
        print(f"stack up in {report.seconds:.1f}s; started: {started}")
    elif args.action == "down":
        stopped = stack.down(_progress)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
    else:
        _print_status(stack)
    return exit_codes.OK


def _print_status(stack) -> None:  # noqa: ANN001 - LocalStack, imported lazily
    for status in stack.status():
        pid = f"pid {status.pid}" if status.pid else ""
        print(f"  {status.name:<14} {status.state:<10} {status.address:<48} {pid}")


def cmd_config(args: argparse.Namespace) -> int:
    from icekeeper.common.config.docs import render_markdown
    from icekeeper.common.config.secrets import masked_dump
    from icekeeper.localstack.settings import SECTION, StackConfig

    if args.action == "docs":
        print(render_markdown({SECTION: StackConfig}), end="")
        return exit_codes.OK
    if args.action == "show":
        print(json.dumps(masked_dump(_config(args)), indent=2))
        return exit_codes.OK
    from icekeeper.config_check import check_config

    check = check_config(args.config, connect=args.connect)
    if check.config is not None:
        use_configured_level(check.config.log_level)
    for line in check.lines():
        print(line, file=sys.stderr if check.errors else sys.stdout)
    return check.exit_code


def cmd_produce_sample(args: argparse.Namespace) -> int:
    from icekeeper.samples.produce import produce_seed_sample

    report = produce_seed_sample(_development_config(args), topic=args.topic, progress=_progress)
    print(json.dumps(report))
    return exit_codes.OK


def cmd_produce_synthetic(args: argparse.Namespace) -> int:
    from icekeeper.samples.produce import produce_synthetic
    from icekeeper.samples.synthetic import SyntheticSpec

    spec = SyntheticSpec(
        seed=args.seed,
        keys=args.keys,
        events=args.events,
        update_ratio=args.update_ratio,
        delete_ratio=args.delete_ratio,
        schema_changes=args.schema_changes,
        poison_ratio=args.poison_ratio,
        format=args.format,
    )
    report = produce_synthetic(
        _development_config(args),
        spec,
        topic=args.topic,
        partitions=args.partitions,
        progress=_progress,
    )
    print(json.dumps(report))
    return exit_codes.OK


def cmd_writer(args: argparse.Namespace) -> int:
    from icekeeper.writers.entry import run_writer

    return run_writer(args)


def cmd_bookkeeper(args: argparse.Namespace) -> int:
    from icekeeper.bookkeeper.service import Bookkeeper

    service = Bookkeeper(_config(args))
    service.install_signal_handlers()

    def show(report) -> None:  # noqa: ANN001 - CycleReport
        for table in report.tables:
            if table.snapshot_id is not None or table.quarantined:
                print(
                    json.dumps(
                        {
                            "table": table.table,
                            "snapshot_id": table.snapshot_id,
                            "monikers": len(table.committed),
                            "records": table.records,
                            "files": table.files,
                            "quarantined": len(table.quarantined),
                            "ms": round(table.seconds * 1000, 1),
                        }
                    ),
                    flush=True,
                )

    from icekeeper.bookkeeper.commit_path import StaleEpoch
    from icekeeper.common.fencing import Fenced

    try:
        service.run(once=args.once, on_cycle=show)
        code = exit_codes.OK
    except (Fenced, StaleEpoch) as error:
        print(
            f"icekeeper bookkeeper: stopped, fenced by a newer bookkeeper: {error}", file=sys.stderr
        )
        code = exit_codes.FENCED
    finally:
        # The service is over (lease released, endpoints closed); what is left is the
        # interpreter's teardown, whose collections over every object the imports made
        # (pyiceberg, pyarrow, SQLAlchemy) took 0.5-1 s on a loaded machine. Frozen, they are
        # skipped, and the process exits within a second of SIGTERM, as supervisors expect.
        gc.freeze()
    return _past_abandoned_lease_calls(code)


def cmd_reaper(args: argparse.Namespace) -> int:
    from icekeeper.reaper.service import Reaper

    config = _config(args)
    if not config.reaper.enabled and not args.dry_run:
        print(
            "icekeeper reaper: reaper.enabled is false (seed 000: iceberg.maintenance.enabled); "
            "nothing to do",
            file=sys.stderr,
        )
        return exit_codes.OK
    every = (
        args.every
        if args.every is not None
        else (None if args.once else config.reaper.execute_interval)
    )
    service = Reaper(config)
    signal.signal(signal.SIGTERM, lambda *_: service.stop.set())

    def show(report) -> None:  # noqa: ANN001 - PassReport
        if args.dry_run:
            for table in report.tables:
                for line in table.planned:
                    print(f"{table.table}: would {line}")
        print(json.dumps(report.to_json()), flush=True)

    failed = []
    try:
        service.run(
            every_s=every,
            dry_run=args.dry_run,
            on_pass=lambda report: (
                show(report),
                failed.extend(error for table in report.tables for error in table.errors),
            ),
        )
    finally:
        service.close()
    # A one-off pass (cron) reports failed steps in its exit code.
    return _past_abandoned_lease_calls(
        exit_codes.FAILED if failed and every is None else exit_codes.OK
    )


def _past_abandoned_lease_calls(code: int) -> int:
    """`code`; but a service that stopped while its lease's store did not answer (a call given
    up at SIGTERM, `common/fencing.py`) ends here, with `code`: the interpreter's exit would wait
    for that call (pyarrow's S3 finalizer waits for every S3 call in flight), up to the store
    client's timeouts and retries after the service itself stopped. The service is over (its
    state saved, its endpoints closed): only the logs and the output are left to flush."""
    from icekeeper.common.fencing import store_calls_abandoned

    if not store_calls_abandoned():
        return code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_status(args: argparse.Namespace) -> int:
    from icekeeper.status import collect_status, render_status

    config = _config(args)
    while True:
        status = collect_status(config)
        if args.json:
            print(json.dumps(status.to_json()), flush=True)
        else:
            print(("\033[2J\033[H" if args.watch else "") + render_status(status), flush=True)
        for unreachable in status.unreachable:
            # One line, not the client's retries: the screen above shows what was read.
            print(f"icekeeper status: {unreachable}", file=sys.stderr, flush=True)
        if not args.watch:
            return exit_codes.UNAVAILABLE if status.unreachable else exit_codes.OK
        time.sleep(args.watch)


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from icekeeper.dead_letters import run_dead_letters

    return run_dead_letters(_config(args), args)


def cmd_bench(args: argparse.Namespace) -> int:
    from icekeeper.bench.layouts import parse_layouts, services_for

    config = _development_config(args)
    layouts = parse_layouts(args.layout or BENCH_DEFAULT_LAYOUT.get(args.target, "local"))
    if args.target not in BENCH_DEFAULT_LAYOUT and layouts != ["local"]:
        raise exit_codes.UsageError(
            f"bench {args.target} runs on local disk only; --layout is for "
            f"{', '.join(BENCH_DEFAULT_LAYOUT)}"
        )
    if args.target != "writer" and len(layouts) > 1:
        raise exit_codes.UsageError(f"bench {args.target}: one --layout at a time")
    stack = None
    if args.start_stack:
        from icekeeper.localstack.stack import LocalStack

        layout_services = services_for(layouts)
        # The bookkeeper's benches need no Kafka: only what their layout runs on.
        only = layout_services if layout_services and args.target != "writer" else None
        stack = LocalStack(config, only=only, with_services=layout_services)
        report = stack.up(_progress)
        started_here = report.started
    try:
        if args.target == "writer":
            from icekeeper.bench.writer import run_writer_bench

            result = run_writer_bench(
                config,
                args.records or 1_000_000,
                progress=_progress,
                cores=args.cores,
                repeat=args.repeat or 3,
                layouts=layouts,
            )
        elif args.target == "bookkeeper":
            from icekeeper.bench.bookkeeper import run_bookkeeper_bench

            result = run_bookkeeper_bench(
                config.state_dir,
                commits=args.commits or 10_000,
                footers=args.footers,
                progress=_progress,
                layout=layouts[0],
                stack_config=config,
                monikers=args.monikers,
            )
        elif args.target == "commit-history":
            from icekeeper.bench.commit_history import run_commit_history_bench

            result = run_commit_history_bench(
                config,
                layout=layouts[0],
                partitions=args.partitions,
                measured=args.commits or 200,
                keep_snapshots_for_s=args.keep_snapshots_for,
                answer_encodings=tuple(e for e in args.answer_encodings.split(",") if e),
                profile_path=args.profile_timed,
                progress=_progress,
            )
        elif args.target == "reaper":
            from icekeeper.bench.reaper import run_reaper_bench

            result = run_reaper_bench(
                config.state_dir, files=args.files, cores=args.cores, progress=_progress
            )
        elif args.target == "e2e":
            from icekeeper.bench.e2e import run_e2e_bench

            result = run_e2e_bench(
                config,
                seconds=args.seconds,
                rate_per_s=args.rate,
                cores=args.cores,
                warmup_s=args.warmup,
                progress=_progress,
                sweep_rates=tuple(float(rate) for rate in args.sweep_rates.split(",") if rate),
            )
        elif args.target == "soak":
            from icekeeper.bench.soak import run_soak

            result = run_soak(
                config,
                minutes=args.minutes,
                report_every_s=args.report_every,
                rate_per_s=args.rate,
                cores=args.cores,
                reaper_every_s=args.reaper_every,
                keep_snapshots_for_s=args.keep_snapshots_for,
                heap_census_path=args.heap_census,
                progress=_progress,
                emit=lambda figures: print(json.dumps(figures), flush=True),
            )
        elif args.target == "key-index":
            from icekeeper.bench.key_index import run_key_index_bench

            result = run_key_index_bench(keys=args.keys or 10_000_000, progress=_progress)
        elif args.target == "key-index-files":
            from icekeeper.bench.key_index import run_key_index_files_bench

            result = run_key_index_files_bench(
                commits=args.commits or 100_000, keys=args.keys or 100_000, progress=_progress
            )
        elif args.target == "upsert":
            from icekeeper.bench.upsert import run_upsert_bench

            result = run_upsert_bench(
                config,
                changes=args.records or 1_000_000,
                cores=args.cores,
                repeat=args.repeat or 1,
                index_keys=args.keys or 10_000_000,
                freshness_s=args.seconds,
                rate_per_s=args.rate,
                freshness_warmup_s=args.warmup,
                table_rows=args.table_rows,
                progress=_progress,
            )
        else:
            raise SystemExit(f"bench {args.target}: unknown")
    finally:
        if stack is not None and started_here:
            stack.down(lambda message: None)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return exit_codes.OK


BENCH_DEFAULT_LAYOUT = {"writer": "local", "bookkeeper": "local", "commit-history": "s3-rest"}
"""The benches that take `--layout` (icekeeper/bench/layouts.py), and their default."""


def cmd_chaos(args: argparse.Namespace) -> int:
    from icekeeper.chaos import run_chaos
    from icekeeper.localstack.stack import LocalStack

    config = _development_config(args)
    stack = LocalStack(config)
    started = stack.up(_progress).started  # idempotent: reuses a running stack
    try:
        result = run_chaos(
            config,
            records=args.records,
            kills=args.kills,
            seed=args.seed,
            progress=_progress,
            timeout_s=args.timeout,
            mode=args.mode,
            transport=args.transport,
            reassignments=args.reassignments,
        )
    finally:
        if started:
            stack.down(lambda message: None)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    for failure in result["failures"]:
        print(f"icekeeper chaos: {failure}", file=sys.stderr)
    return exit_codes.FAILED if result["failures"] else exit_codes.OK


def cmd_demo(args: argparse.Namespace) -> int:
    if args.source == "mariadb":
        from icekeeper.demo_mariadb import run_mariadb_demo
        from icekeeper.localstack.stack import StackError

        try:
            summary = run_mariadb_demo(
                _development_config(args), keep_stack=args.keep_stack, progress=_progress
            )
        # e.g. MariaDB's Debian package missing and not root: the message says what to install
        except StackError as error:
            print(f"icekeeper demo --source mariadb: {error}", file=sys.stderr)
            return exit_codes.USAGE
    else:
        from icekeeper.demo import run_demo

        summary = run_demo(
            _development_config(args), keep_stack=args.keep_stack, progress=_progress
        )
    if args.json:
        print(json.dumps(summary))
    return exit_codes.OK


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message is the whole story for a user: printed without a traceback."""
    from icekeeper.common.artifacts import ArtifactError
    from icekeeper.common.executor_env import ExecutorEnvError
    from icekeeper.localstack.java import JavaNotFound
    from icekeeper.localstack.stack import StackError

    return (ArtifactError, ExecutorEnvError, JavaNotFound, StackError)


EXTRAS = {
    "pyspark": "spark",
    "polars": "spark",
    "pyiceberg_core": "spark",
    "duckdb": "dev",
    "pymysql": "dev",
    "psycopg": "dev",
    "pytz": "dev",
}
"""Top-level module -> the extra that installs it (pyproject.toml): the base install runs the
bookkeeper, `status`, `dead-letters` and `config`; the writer and the reaper need `spark`; the
demo, benchmarks, chaos and the CDC sources need `dev`."""


class _Parser(argparse.ArgumentParser):
    """argparse, with each error on one line and exit 2 (`exit_codes.USAGE`): the usage block it
    prints first pushes the error itself out of sight."""

    def error(self, message: str) -> NoReturn:
        self.exit(exit_codes.USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _duration(text: str) -> float:
    """A duration argument (`10m`, `1h`, `90s`, seconds), as config files write them."""
    try:
        return parse_duration_s(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_logging_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """`-v` and `--log-level`, before the command (`top`) or after it: both count, so neither
    position surprises. After it, they default to nothing, so as not to undo the ones before."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbose" if top else "verbose_after_command",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="more logging (-v info, -vv debug); JSON lines on stderr",
    )
    group.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=None if top else argparse.SUPPRESS,
        help="log level (wins over -v; default: the config's log_level, which "
        "ICEKEEPER__LOG_LEVEL overrides, else warning)",
    )


def _version() -> str:
    """icekeeper's version, and pyspark's (or that this install runs without Spark)."""
    try:
        own = package_metadata.version("icekeeper")
    except package_metadata.PackageNotFoundError:
        own = "(not installed)"
    try:
        spark = f"pyspark {package_metadata.version('pyspark')}"
    except package_metadata.PackageNotFoundError:
        spark = "no pyspark: the bookkeeper's install; pip install 'icekeeper[spark]' for writers"
    return f"icekeeper {own} (Python {sys.version.split()[0]}, {spark})"


class _PrintVersion(argparse.Action):
    """`--version` on one line as written (argparse's own action rewraps it to the terminal)."""

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:  # noqa: ANN001
        print(_version())
        parser.exit(exit_codes.OK)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="icekeeper", description="Stream change data from Kafka into Apache Iceberg tables."
    )
    parser.add_argument(
        "--version", action=_PrintVersion, nargs=0, help="show the version and exit"
    )
    _add_logging_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        _add_logging_options(sub, top=False)
        sub.add_argument(
            "--config",
            "-c",
            default=None,
            help="YAML or seed-000 .properties file (default: embedded defaults)",
        )
        sub.set_defaults(handler=handler)
        return sub

    stack = add(
        "stack",
        cmd_stack,
        "start, stop or show the local Kafka, schema registry and Azurite (and MariaDB, "
        "PostgreSQL, Debezium; an S3 server and Iceberg catalogs)",
    )
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.add_argument(
        "--only",
        nargs="+",
        metavar="SERVICE",
        help="kafka, registry, azurite-queue, azurite-blob, and those --with adds (default: all)",
    )
    stack.add_argument(
        "--with",
        dest="with_services",
        nargs="+",
        action="extend",
        type=_optional_service_names,
        metavar="SERVICE",
        help="also run a CDC source: mariadb and/or postgres (each with Kafka Connect running "
        "Debezium), or connect alone; or a secured broker (kafka-sasl: SASL_SSL, SCRAM, a CA made "
        "at start) and a basic-auth registry (registry-auth); or an S3 server (s3) and Iceberg "
        "catalogs with their tables on it (rest, nessie, hms, pg-catalog; each brings s3). Names "
        "separated by spaces or commas; down and status cover what an earlier up --with started",
    )

    config = add(
        "config",
        cmd_config,
        "check a config file, print it resolved, or print the documentation of every key",
    )
    config.add_argument("action", choices=["check", "show", "docs"], nargs="?", default="check")
    config.add_argument(
        "--connect",
        action="store_true",
        help="check: also open the catalog (and each table), the storage, each Kafka cluster and "
        "schema registry, read-only (exit 4 if one does not answer)",
    )

    sample = add(
        "produce-sample",
        cmd_produce_sample,
        "produce the seed 000 tbl_test_1 CDC stream as Confluent-framed Avro",
    )
    sample.add_argument(
        "--topic", default=None, help="topic (default: the first topic of the first source)"
    )

    synthetic = add(
        "produce-synthetic", cmd_produce_synthetic, "produce a larger reproducible CDC stream"
    )
    synthetic.add_argument("--topic", default=None)
    synthetic.add_argument("--partitions", type=int, default=3)
    synthetic.add_argument("--seed", type=int, default=1)
    synthetic.add_argument("--keys", type=int, default=1000)
    synthetic.add_argument("--events", type=int, default=10_000)
    synthetic.add_argument("--update-ratio", type=float, default=0.6)
    synthetic.add_argument("--delete-ratio", type=float, default=0.1)
    synthetic.add_argument("--schema-changes", type=int, default=2)
    synthetic.add_argument("--poison-ratio", type=float, default=0.0)
    synthetic.add_argument("--format", choices=["avro", "json"], default="avro")

    from icekeeper.writers.entry import add_writer_arguments

    add_writer_arguments(
        add(
            "writer",
            cmd_writer,
            "run a writer: Kafka batches -> Parquet files + monikers (never commits)",
        )
    )

    bookkeeper = add(
        "bookkeeper", cmd_bookkeeper, "run the bookkeeper: commit monikers to Iceberg exactly once"
    )
    bookkeeper.add_argument("--once", action="store_true", help="one cycle, then exit")

    reaper = add(
        "reaper",
        cmd_reaper,
        "maintenance: retention, compaction, snapshot expiry, orphan removal (never pending files)",
    )
    when = reaper.add_mutually_exclusive_group()
    when.add_argument(
        "--once", action="store_true", help="one pass, then exit (for cron and Kubernetes CronJobs)"
    )
    when.add_argument(
        "--every",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="a pass every DURATION (10m, 1h, seconds); default: reaper.execute_interval",
    )
    reaper.add_argument(
        "--dry-run", action="store_true", help="list what would change, change nothing"
    )

    status = add(
        "status",
        cmd_status,
        "tables, writers, pending monikers, lag, freshness and dead letters at a glance",
    )
    status.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    status.add_argument(
        "--watch",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="refresh every DURATION (2s, 1m, seconds)",
    )

    from icekeeper.dead_letters import add_dead_letter_arguments

    add_dead_letter_arguments(
        add(
            "dead-letters",
            cmd_dead_letters,
            "list or replay quarantined monikers and dead-lettered records "
            "(once the cause is fixed; exactly once)",
        )
    )

    bench = add(
        "bench",
        cmd_bench,
        "benchmarks that print ratios against a baseline run on the same machine",
    )
    bench.add_argument(
        "target",
        choices=[
            "writer",
            "bookkeeper",
            "commit-history",
            "reaper",
            "e2e",
            "soak",
            "key-index",
            "key-index-files",
            "upsert",
        ],
    )
    bench.add_argument(
        "--records",
        type=int,
        default=None,
        help="records to preload (writer, upsert: default 1,000,000)",
    )
    bench.add_argument("--cores", type=int, default=None, help="Spark local cores (default: all)")
    bench.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="writer (default 3), upsert (default 1): runs of ours and the "
        "baseline (upsert: and our changelog path), taken in turns (figures are medians)",
    )
    bench.add_argument(
        "--layout",
        default=None,
        metavar="LAYOUT[,LAYOUT]",
        help="where the tables go: local (a SQLite catalog, a local warehouse), s3 (the same "
        "catalog, the warehouse on the stack's S3 server: stack up --with s3), s3-rest (S3 behind "
        "the stack's Iceberg REST catalog: --with rest); --start-stack starts what it needs. "
        "bookkeeper (default local), commit-history (default s3-rest): one layout; writer: "
        "local,s3 adds a side, the default engine with its warehouse on S3, taking turns with "
        "the local ones, and its ratio to local disk ('s3': 'visible_vs_local'). "
        "To measure issue 28's figures: bench bookkeeper --layout s3, bench bookkeeper --layout "
        "s3-rest, bench writer --layout local,s3, bench commit-history (each --start-stack --json)",
    )
    bench.add_argument(
        "--commits",
        type=int,
        default=None,
        help="bookkeeper: single-moniker commits for the latency curve (default 10,000); "
        "commit-history: commits timed at one a second after the history (default 200); "
        "key-index-files: commits, one data file each, before the index is saved (default "
        "100,000)",
    )
    bench.add_argument(
        "--monikers",
        type=int,
        default=1000,
        help="bookkeeper: monikers (one file each) the one timed cycle commits",
    )
    bench.add_argument("--footers", type=int, default=10_000, help="bookkeeper: footers to read")
    bench.add_argument(
        "--partitions",
        type=int,
        default=64,
        help="commit-history: partitions of the topic, each one's offsets in every snapshot",
    )
    bench.add_argument(
        "--answer-encodings",
        default="",
        help="commit-history: Accept-Encoding values the timed commits take turns asking the REST "
        "catalog for, e.g. identity,gzip (default: the bookkeeper's own, identity)",
    )
    bench.add_argument(
        "--profile-timed",
        metavar="FILE",
        help="commit-history: profile the timed commits (cProfile of the committing thread: the "
        "pools' threads show as waits) into FILE (pstats); their latencies then include the "
        "profiler's cost",
    )
    bench.add_argument(
        "--files",
        type=int,
        default=1000,
        help="reaper: small files (one snapshot each) in the table",
    )
    bench.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="e2e, upsert: how long to produce for freshness (upsert: 0 skips it)",
    )
    bench.add_argument(
        "--rate",
        type=float,
        default=2000.0,
        help="e2e, upsert: records produced per second for freshness; soak: the load",
    )
    bench.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="e2e, upsert: seconds of the same load before the freshness clock starts",
    )
    bench.add_argument(
        "--sweep-rates",
        default="4000,8000,16000,32000",
        help="e2e: higher rates tried after the main window, 30 s each, until p99 freshness "
        "exceeds 5 s (comma-separated; empty for none)",
    )
    bench.add_argument(
        "--minutes", type=float, default=90.0, help="soak: how long the pipeline runs"
    )
    bench.add_argument(
        "--report-every",
        type=float,
        default=600.0,
        help="soak: seconds between the JSON lines of memory and commit latency",
    )
    bench.add_argument(
        "--reaper-every", type=float, default=600.0, help="soak: seconds between reaper passes"
    )
    bench.add_argument(
        "--keep-snapshots-for",
        type=float,
        default=None,
        help="soak: the bookkeeper's keep_snapshots_for in seconds (default: the config's, 1 h); "
        "commit-history: also the history built, one snapshot per second of it",
    )
    bench.add_argument(
        "--heap-census",
        type=Path,
        default=None,
        help="soak: a JSON-lines file the bookkeeper appends to every minute with what its "
        "memory is made of (Python objects, pymalloc arenas, glibc heaps, Arrow's pool)",
    )
    bench.add_argument(
        "--keys",
        type=int,
        default=None,
        help="key-index, upsert: keys in the upsert key index (default 10,000,000); "
        "key-index-files: keys the commits update (default 100,000)",
    )
    bench.add_argument(
        "--table-rows",
        type=int,
        default=0,
        help="upsert: rows every timed run's table starts with (keys the "
        "changes never touch, loaded untimed): a source table larger than the keys it changes",
    )
    bench.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON line (last line of stdout)",
    )
    bench.add_argument(
        "--start-stack", action="store_true", help="start the local stack first (and stop it after)"
    )

    chaos = add(
        "chaos",
        cmd_chaos,
        "kill -9 writers, bookkeeper and reaper at random, reassign partitions to new writers; "
        "verify exactly-once by offset and the upsert table's state",
    )
    chaos.add_argument("--records", type=int, default=5000)
    chaos.add_argument("--kills", type=int, default=5)
    chaos.add_argument("--seed", type=int, default=1)
    chaos.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for everything to settle (a 20,000-record "
        "run took 870 s on a busy 2-core machine)",
    )
    chaos.add_argument(
        "--mode",
        choices=["both", "changelog", "upsert"],
        default="both",
        help="tables fed by the topic: both (default): chaos.orders (changelog, checked by offset) "
        "and chaos.orders_mirror (upsert, checked against a reference built from the Kafka "
        "records); or only one of them",
    )
    chaos.add_argument(
        "--transport",
        choices=["txlog", "azure-queue"],
        default="txlog",
        help="how monikers travel: txlog (a folder, the default) or azure-queue (the local "
        "stack's Azurite; one writer sends every moniker as a pointer to its journal copy)",
    )
    chaos.add_argument(
        "--reassignments",
        type=int,
        default=1,
        help="times the writers' partitions change writer (new instance_count, new writer ids) "
        "while the bookkeeper lags and monikers are pending, one writer restarting over a "
        "backlog larger than one commit (default 1)",
    )
    chaos.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON line (last line of stdout)",
    )

    demo = add("demo", cmd_demo, "run the whole pipeline on the local stack and show the result")
    demo.add_argument(
        "--source",
        choices=["seed000", "mariadb"],
        default="seed000",
        help="seed000: seed 000's sample stream (default); mariadb: a real MariaDB through "
        "Debezium, compared with the table (exit 2 if the stack cannot start, e.g. the "
        "mariadb-server package is missing)",
    )
    demo.add_argument(
        "--keep-stack",
        action="store_true",
        help="leave the local stack (and with --source mariadb, the connector) running afterwards",
    )
    demo.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (common/exit_codes.py, the same for every
    command)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose + getattr(args, "verbose_after_command", 0), args.log_level)
    started = time.monotonic()
    try:
        return args.handler(args)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return exit_codes.USAGE
    except ModuleNotFoundError as error:
        extra = EXTRAS.get((error.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"icekeeper {args.command}: needs {error.name}, which this install leaves out: "
            f"pip install 'icekeeper[{extra}]'",
            file=sys.stderr,
        )
        return exit_codes.USAGE
    except (exit_codes.UsageError, *_user_errors()) as error:
        print(f"icekeeper {args.command}: {error}", file=sys.stderr)
        return exit_codes.USAGE if isinstance(error, exit_codes.UsageError) else exit_codes.FAILED
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - started:.1f}s", file=sys.stderr)
        return exit_codes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
