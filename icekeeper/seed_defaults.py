"""Seed 000's source and table: what the development commands run on when a config has none.

The production config lists no source and no table by default (a deployment names its own, and a
service without them stops with an error that says what to add: common/config/required.py). The
commands that show icekeeper on the local stack, `icekeeper demo` (README's first command, run on
a fresh machine with no config file), `produce-sample`, the benchmarks and the chaos run, fill the
gap with seed 000's topic and table, here and nowhere else.
"""

from __future__ import annotations

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource, TableSpec
from icekeeper.samples import seed000

SEED_SOURCE = KafkaSource(topics=[seed000.TOPIC])
"""Seed 000's topic on the local stack (the model's connection defaults: `icekeeper stack up`)."""

SEED_TABLE = TableSpec(
    identifier="db_gb18030_test.tbl_test_1", topics=[seed000.TOPIC], primary_key=["ID1", "ID2"]
)
"""Seed 000's table, keyed as seed 000's result table is (so an upsert mirror)."""


def with_seed_defaults(config: IcekeeperConfig) -> IcekeeperConfig:
    """`config`, plus seed 000's source when it has no source and seed 000's table (on its first
    source) when it has no table; a config that has them is returned as it is."""
    if config.sources and config.tables:
        return config
    sources = config.sources or [SEED_SOURCE]
    tables = config.tables or [SEED_TABLE.model_copy(update={"source": sources[0].name})]
    seeded = config.model_copy(update={"sources": sources, "tables": tables})
    return IcekeeperConfig.model_validate(seeded.model_dump(mode="python")).with_development(
        config.development
    )
