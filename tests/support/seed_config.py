"""Configs that start from seed 000's source and table, as the development commands do.

The production config lists no source and no table; most tests write seed 000's table, or a table
of their own made by overriding its fields (`ICEKEEPER__TABLES__0__IDENTIFIER`, `..._MODE`), so
their configs start from seed 000's source and table (icekeeper/seed_defaults.py), given as the
whole-list overrides `ICEKEEPER__SOURCES` and `ICEKEEPER__TABLES`: the loader applies variables
in name order, so the field overrides of `environ` land on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.seed_defaults import SEED_SOURCE, SEED_TABLE

SEED_ENVIRON = {
    "ICEKEEPER__SOURCES": json.dumps([SEED_SOURCE.model_dump(mode="json", exclude_defaults=True)]),
    "ICEKEEPER__TABLES": json.dumps([SEED_TABLE.model_dump(mode="json", exclude_defaults=True)]),
}
"""Seed 000's source and table as environment overrides (JSON is YAML, which the loader reads)."""


def seed_config(environ: Mapping[str, str] | None = None) -> IcekeeperConfig:
    """The embedded defaults with seed 000's source and table, then `environ`'s overrides: its
    `ICEKEEPER__SOURCES__0__...` / `ICEKEEPER__TABLES__0__...` change fields of them, its own
    `ICEKEEPER__SOURCES` / `ICEKEEPER__TABLES` replace them."""
    return load_config(None, environ={**SEED_ENVIRON, **(environ or {})})
