"""How a batch is cut into Spark tasks and which
Parquet settings its files get (no Spark needed)."""

from __future__ import annotations

from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES
from icekeeper.common.parquet_files import parquet_write_options
from icekeeper.writers.offsets import BatchPlan


def plan_of(*sizes: int) -> BatchPlan:
    return BatchPlan(
        read_ranges={
            ("orders", partition): (1000, 1000 + size) for partition, size in enumerate(sizes)
        },
        table_starts={},
    )


def test_a_large_batch_gives_every_core_two_tasks_so_uneven_partitions_leave_no_core_idle() -> None:
    # 3 Kafka partitions on 2 cores: one task per partition would run the third alone.
    per_task = plan_of(166_000, 167_000, 167_000).records_per_task(parallelism=2, smallest=50_000)
    assert per_task == 125_000
    tasks = sum(-(-size // per_task) for size in (166_000, 167_000, 167_000))
    assert tasks == 6 and tasks % 2 == 0


def test_a_small_batch_is_not_cut_into_tiny_files() -> None:
    assert plan_of(3_000, 2_000).records_per_task(parallelism=8, smallest=50_000) == 50_000


def test_icebergs_parquet_table_properties_become_spark_write_options() -> None:
    options = parquet_write_options(
        {
            "write.parquet.compression-codec": "SNAPPY",
            "write.parquet.dict-size-bytes": "1024",
            "write.parquet.row-group-size-bytes": "8388608",
            "write.parquet.page-size-bytes": "65536",
            "write.parquet.page-row-limit": "5000",
            "write.parquet.bloom-filter-enabled.column.id": "true",
            "write.parquet.bloom-filter-max-bytes": "1048576",
            "write.parquet.compression-level": "9",
            "commit.retry.num-retries": "4",
        }
    )
    assert options == {
        "compression": "snappy",
        "parquet.dictionary.page.size": "1024",
        "parquet.block.size": "8388608",
        "parquet.page.size": "65536",
        "parquet.page.row.count.limit": "5000",
        "parquet.bloom.filter.enabled#id": "true",
        "parquet.bloom.filter.max.bytes": "1048576",
    }


def test_the_compression_level_applies_to_zstd_and_the_defaults_give_small_dictionaries() -> None:
    options = parquet_write_options(
        {**DEFAULT_TABLE_PROPERTIES, "write.parquet.compression-level": "3"}
    )
    assert options["compression"] == "zstd"
    assert options["parquet.compression.codec.zstd.level"] == "3"
    assert int(options["parquet.dictionary.page.size"]) <= 64 * 1024
