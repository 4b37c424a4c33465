"""`icekeeper bench upsert`: its change stream is a valid CDC stream with the issue's mix, and at
small scale ours, our changelog path and the `MERGE INTO` baseline end in the state that stream
leaves, with every figure issue 13 asks for present and plausible."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.bench.upsert import SIDES, run_upsert_bench
from icekeeper.bench.upsert_data import OPS, ChangePlan, plan_changes
from icekeeper.common.config import IcekeeperConfig


def replay(plan: ChangePlan) -> dict[int, int]:
    """Key -> the change that wrote its live row, checking
    every change against the keys' state as it goes."""
    live: dict[int, int] = {}
    for seq, (op, key, before) in enumerate(
        zip(OPS[plan.op].tolist(), plan.key.tolist(), plan.prev_seq.tolist())
    ):
        if op == "c":
            assert key not in live and before == -1, f"change {seq} inserts live key {key}"
            live[key] = seq
        else:
            assert live.get(key) == before, (
                f"change {seq} ({op}) of key {key}: before image {before}, live row {live.get(key)}"
            )
            if op == "d":
                del live[key]
            else:
                live[key] = seq
    return live


def test_the_change_plan_is_a_valid_cdc_stream_with_the_issues_mix_and_knows_its_final_state() -> (
    None
):
    plan = plan_changes(100_000, 10_000)
    counts = plan.op_counts()
    assert sum(counts.values()) == 100_000
    assert (
        abs(counts["updates"] / 100_000 - 0.7) < 0.01
        and abs(counts["deletes"] / 100_000 - 0.1) < 0.01
    )
    assert abs(counts["inserts"] / 100_000 - 0.2) < 0.01
    live = replay(plan)
    keys, seqs, _ = plan.final_rows()
    assert dict(zip(keys.tolist(), seqs.tolist())) == live
    assert 9_000 < len(live) <= 10_000  # 20% inserts less 10% deletes fill the key set by the end
    assert (
        plan_changes(100_000, 10_000).key.tolist() == plan.key.tolist()
    )  # reproducible from its seed


@pytest.mark.heavy
@pytest.mark.integration
@pytest.mark.spark
def test_every_side_ends_in_the_streams_final_state_and_every_figure_is_reported(
    local_stack, spark, stack_config: IcekeeperConfig, tmp_path: Path
) -> None:
    base = stack_config.model_copy(update={"state_dir": str(tmp_path)})
    result = run_upsert_bench(
        base,
        changes=20_000,
        keys=2_000,
        batch_records=5_000,
        warmup_changes=2_000,
        index_keys=100_000,
        freshness_s=5,
        rate_per_s=500,
        freshness_warmup_s=3,
        cores=2,
        table_rows=3_000,
        spark=spark,
        progress=print,
    )

    live = replay(plan_changes(20_000, 2_000))
    rows = len(live) + 3_000  # every table started with 3,000 rows the changes never touch
    assert result["equal_final_state"] and result["final_rows"] == rows
    for side in SIDES:
        state = result["final_states"][0]["states"][side]
        assert state["source_columns"] == result["final_states"][0]["expected"], side
        assert state["all_columns"]["rows"] == state["all_columns"]["keys"] == rows, side
    assert result["scan_rows_equal"]  # DuckDB read every live row, before and after the reaper pass

    ours, baseline = result["runs"]["ours"][0], result["runs"]["baseline"][0]
    assert ours["batches"] >= 4 and baseline["batches"] >= 4  # 5,000-change batches, not one
    for side in SIDES:
        assert result[f"{side}_changes_per_s"] > 0
    assert result["ratio_vs_baseline"] == pytest.approx(
        result["ours_changes_per_s"] / result["baseline_changes_per_s"], abs=0.01
    )
    assert 0 < ours["writer_s"] <= ours["seconds"] == result["ours_s"]
    # Both merge on read; ours also purges mostly-deleted files after its commits
    # (`bookkeeper/purges.py`), so its table keeps fewer deleted rows than MERGE INTO's.
    assert ours["files"]["position_deletes"] < baseline["files"]["position_deletes"]
    assert result["index_keys"] >= 100_000 and 0 < result["index_bytes_per_key"] <= 64
    assert result["index_ops_per_s"] > 0 and result["index_recovery_s"] >= 0
    assert (
        result["scan_s"] > 0 and result["scan_compacted_s"] > 0 and result["scan_rewritten_s"] > 0
    )
    assert result["baseline_scan_s"] > 0  # the MERGE INTO table, same deleted rows
    assert (
        result["scans"]["files_before_reaper"]["position_deletes"]
        < result["scans"]["baseline_files"]["position_deletes"]
    )
    assert result["freshness"]["records"] == 5 * 500  # every change timed, deletes too
    assert 0 < result["freshness_p50_s"] <= result["freshness_p99_s"]
