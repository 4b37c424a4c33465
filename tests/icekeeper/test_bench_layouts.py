"""The benches of issue 28's figures at a tiny scale, on the stack's S3 server and REST catalog:
each layout option reaches the tables (their metadata and data files are on S3, the catalog is
the REST one), every figure is reported with a sane value, and nothing is left in the bucket.
The figures themselves come from full runs on a quiet machine (bench/results.md)."""

from __future__ import annotations

import pstats
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icekeeper.bench.layouts import parse_layouts, services_for
from icekeeper.common import exit_codes
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.exit_codes import UsageError
from icekeeper.common.storage import (
    StorageSettings,
    configure_storage,
    list_files,
    storage_settings,
)
from tests.support.object_stores import storage_door


def test_layout_names_and_the_services_each_needs() -> None:
    assert parse_layouts("local, s3,local") == ["local", "s3"]
    assert services_for(["local", "s3-rest"]) == ["s3", "rest"]
    with pytest.raises(UsageError, match="no layout s4"):
        parse_layouts("s3,s4")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "reaper", "--layout", "s3"],  # a bench without layouts
        ["bench", "bookkeeper", "--layout", "local,s3"],  # one layout at a time
        ["bench", "writer", "--layout", "s3-rest"],  # the writer's layouts: local, s3
        ["bench", "commit-history", "--layout", "s4"],
    ],
)
def test_a_layout_a_bench_cannot_take_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from icekeeper.cli import main

    monkeypatch.setenv("ICEKEEPER__STATE_DIR", str(tmp_path))
    assert main(argv) == exit_codes.USAGE
    assert list(tmp_path.iterdir()) == []  # refused before any work


@pytest.fixture(autouse=True)
def _storage_door_as_before() -> Iterator[None]:
    """A bench configures this process's storage door for its layout (a CLI run's whole
    process): in a test it would stay pointed at the layout's S3 server for every later test."""
    previous = storage_settings()
    yield
    configure_storage(previous)


def _left_under(root: str, properties: dict[str, str]) -> list[str]:
    with storage_door(properties):
        return [info.path for info in list_files(root, recursive=True)]


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["s3", "s3-rest"])
def test_bench_bookkeeper_puts_its_tables_on_the_layout(
    layout: str, request, stack_config: IcekeeperConfig, tmp_path: Path
) -> None:
    from icekeeper.bench.bookkeeper import run_bookkeeper_bench

    service = request.getfixturevalue("rest_catalog" if layout == "s3-rest" else "s3_storage")
    result = run_bookkeeper_bench(
        str(tmp_path),
        commits=12,
        footers=70,
        progress=print,
        layout=layout,
        stack_config=stack_config,
        monikers=20,
    )
    print(result)
    assert result["layout"] == layout
    bucket = (service.storage if layout == "s3-rest" else service).uri()
    assert result["metadata_location"].startswith(result["root"]) and result["root"].startswith(
        bucket
    )
    assert result["catalog_class"] == ("RestCatalog" if layout == "s3-rest" else "SqlCatalog")
    # The monikers went through a transaction log on the store, as in production.
    assert result["txlog_uri"].startswith(result["root"])
    # Three 1,000-moniker runs (here 20) and the add_files table, 70 footers, 12 commits.
    assert result["data_files_on_store"] == 3 * 20 + 70 + 12
    for key in ("commit_20_monikers_s", "baseline_add_files_20_s", "footers_70_s"):
        assert 0 < result[key] < 120, key
    assert 0 < result["commit_ms_at_10"] and 0 < result["commit_ms_at_12"]
    assert result["commit_p90_ms_at_12"] >= result["commit_ms_at_12"]
    # What the stack's servers took of the machine while the footers were read and the
    # monikers committed: s3proxy answered every GET, the REST server (s3-rest) every commit.
    assert 0 < result["footers_70_s3_server_cpu_s"] <= result["footers_70_machine_busy_cpu_s"]
    assert result["footers_70_wall_s"] <= result["footers_70_s"]
    assert result["commit_20_monikers_machine_busy_cpu_s"] > 0
    if layout == "s3-rest":
        assert result["commit_20_monikers_rest_server_cpu_s"] > 0
    # A small file in one PUT and in a multipart upload, both timed (and removed after).
    assert result["small_write_one_put_ms"] > 0 and result["small_write_multipart_ms"] > 0
    assert _left_under(result["root"], service.pyiceberg_properties()) == []


@pytest.mark.integration
def test_bench_commit_history_on_s3_and_the_rest_catalog(
    rest_catalog, stack_config: IcekeeperConfig, tmp_path: Path
) -> None:
    """20 s of history (20 snapshots, a 64-partition topic), 8 commits at one a second: the
    oldest snapshots expire while they are timed, and what a snapshot adds to the metadata file
    does not grow with the topic's partitions."""
    from icekeeper.bench.commit_history import run_commit_history_bench

    result = run_commit_history_bench(
        stack_config,  # its state folder: the bench finds the stack's servers by their pid files
        layout="s3-rest",
        partitions=64,
        measured=8,
        keep_snapshots_for_s=20,
        answer_encodings=("identity", "gzip"),
        progress=print,
        profile_path=str(tmp_path / "timed.pstats"),
    )
    print(result)
    assert result["layout"] == "s3-rest" and result["catalog_class"] == "RestCatalog"
    # The timed commits' profile: each cycle and each REST commit in it, 8 of each.
    profiled = pstats.Stats(str(tmp_path / "timed.pstats")).stats  # type: ignore[attr-defined]
    calls = {name: stat[1] for (_, _, name), stat in profiled.items()}
    assert calls["run_cycle"] == 8 and calls["commit_table"] == 8
    assert result["metadata_location"].startswith(rest_catalog.storage.uri())
    assert result["history"] == 20 and result["snapshots_before"] == 20
    # Expired while timed: fewer than the 28 committed are kept, never fewer than keep_snapshots.
    assert 20 <= result["snapshots_after"] < 28
    assert 0 < result["commit_p50_ms"] <= result["commit_p99_ms"] <= result["commit_slowest_ms"][-1]
    assert result["commit_p50_ms"] <= result["cycle_p50_ms"]
    # The server's share: each commit's answer comes within the commit's own time.
    assert 0 < result["rest_commit_answer_p50_ms"] < result["commit_p50_ms"]
    assert result["rest_commit_answer_p50_ms"] <= result["rest_commit_answer_p99_ms"]
    assert result["rest_requests_per_commit"] >= 1
    # Each timed commit is named: the expiries (snapshots dropped above) and the plain appends,
    # none a merge yet (pyiceberg merges manifests at 100).
    kinds = result["commit_p50_ms_by_kind"]
    assert kinds["expiry_count"] >= 1 and kinds["plain_count"] >= 1 and kinds["merge_count"] == 0
    assert kinds["expiry_count"] + kinds["plain_count"] == 8
    # The two answer encodings took turns, each commit's server share counted on its side.
    sides = result["by_answer_encoding"]
    assert set(sides) == {"identity", "gzip"}
    assert all(side["commits"] == 4 for side in sides.values())
    assert sides["identity"]["answers_in"] == ["identity"] and sides["gzip"]["answers_in"] == [
        "gzip"
    ]
    assert all(0 < side["server_p50_ms"] < side["commit_p50_ms"] for side in sides.values())
    slowest = result["slowest_commits"]
    assert [k["commit_ms"] for k in slowest] == sorted(k["commit_ms"] for k in slowest)
    assert all(0 < k["server_ms"] < k["commit_ms"] for k in slowest)
    # Each timed cycle's CPU: the REST server rewrote the metadata file, s3proxy stored it,
    # all within what the machine's cores spent.
    servers = result["cycle_server_cpu_mean_ms"]
    assert set(servers) == {"rest", "s3"} and servers["rest"] > 0 and servers["s3"] > 0
    assert result["cycle_machine_cpu_mean_ms"] >= max(servers.values())
    # The 64 partitions' offsets ("12":1000000800) and event times ("12":1646297175000) are in
    # the table's state property, once per metadata file, and in no snapshot's summary: what a
    # snapshot adds stays under a kilobyte and a quarter whatever the partitions.
    assert result["partition_offsets_bytes"] == 0
    assert 64 * 2 * 15 < result["state_property_bytes"]
    assert result["summary_bytes"] < result["snapshot_bytes"] < 1_250
    assert result["snapshot_bytes"] * result["snapshots_after"] < result["metadata_bytes"]
    assert 0.5 < result["snapshots_share_of_metadata"] < 1


@pytest.mark.heavy
@pytest.mark.integration
@pytest.mark.spark
def test_bench_writer_takes_turns_on_local_disk_and_s3(
    local_stack, s3_storage, spark, stack_config: IcekeeperConfig, tmp_path: Path
) -> None:
    """`--layout local,s3`: the default engine also writes to S3 (the bench checks each data
    file of the S3 side's table is under the layout's root) and its ratio to local disk is
    reported."""
    from icekeeper.bench.writer import run_writer_bench

    catalog = stack_config.catalog.model_copy(update={"name": f"bench_{uuid.uuid4().hex[:6]}"})
    base = stack_config.model_copy(update={"state_dir": str(tmp_path), "catalog": catalog})
    result = run_writer_bench(
        base,
        20_000,
        progress=print,
        cores=2,
        repeat=1,
        layouts=["local", "s3"],
        spark=spark,
        warmup_records=5_000,
    )
    print(result)
    assert result["layouts"] == ["local", "s3"]
    on_s3 = result["s3"]
    assert on_s3["engine"] == base.writer.engine
    assert 0 < on_s3["writer_s"] <= on_s3["visible_s"] and len(on_s3["visible_runs_s"]) == 1
    assert on_s3["visible_vs_local"] == pytest.approx(
        on_s3["visible_s"] / result["default_s"], rel=0.02
    )
    assert result["default_s"] > 0 and result["baseline_s"] > 0


@pytest.mark.integration
def test_a_runs_files_on_s3_are_removed_whatever_the_door_was_set_to_since(
    s3_storage, stack_config: IcekeeperConfig, tmp_path: Path
) -> None:
    """`bench writer --layout local,s3` ran its local sides' bookkeepers last, which set the door
    for their local catalog: the cleanup then looked for the bucket on AWS and the bench failed
    before printing its figures."""
    from icekeeper.bench.layouts import open_layout, remove_layout_files
    from icekeeper.common.storage import write_file

    layout = open_layout("s3", stack_config, tmp_path / "work")
    with storage_door(layout.catalog_properties):
        write_file(layout.location("data", "f.parquet"), b"PAR1")
    with storage_door({}):  # what a local side leaves behind
        remove_layout_files(layout)
        assert storage_settings() == StorageSettings.from_properties({})  # and left as it was
    assert _left_under(layout.root, s3_storage.pyiceberg_properties()) == []
