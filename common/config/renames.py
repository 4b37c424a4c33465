"""Keys that moved to another section, still read from their old place for one release.

A config file written for the previous release keeps working: each old key is moved to its new
place before validation, with a warning naming both, so the file can be fixed at leisure. The
keys moved because a role read another role's section (issue 16): settings two roles share live
in a shared section (`spark`, `group`), and a writer's back-pressure limit lives with the writer.
Remove an entry one release after it was added.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

RENAMED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    ("writer", "spark_master"): ("spark", "master"),
    ("writer", "spark_conf"): ("spark", "conf"),
    ("bookkeeper", "group"): ("group", "name"),
    ("bookkeeper", "lease_uri"): ("group", "lease_uri"),
    ("reaper", "orphan_grace"): ("group", "orphan_grace"),
    ("bookkeeper", "max_pending_bytes"): ("writer", "max_pending_bytes"),
}
"""(section, old key) -> (section, new key); added in the release after 0.1."""


def move_renamed_keys(raw: Any) -> Any:
    """Move every old key of `raw` (a config mapping before validation) to its new place.

    Returns a copy when something moved; `raw` itself otherwise. An old key and its new key both
    set to different values is an error: which one the user meant cannot be guessed.
    """
    if not isinstance(raw, dict):
        return raw
    moved: dict[str, Any] | None = None
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        section = (moved or raw).get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        if moved is None:
            moved = {
                name: dict(value) if isinstance(value, dict) else value
                for name, value in raw.items()
            }
        value = moved[old_section].pop(old_key)
        target = moved.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # a malformed section: validation names it
        old, new = f"{old_section}.{old_key}", f"{new_section}.{new_key}"
        if new_key in target and target[new_key] != value:
            raise ValueError(
                f"{old} and {new} are both set, to different values: {old} is the old name of "
                f"{new}; keep {new} only"
            )
        target[new_key] = value
        log.warning(
            f"config key {old} is deprecated: it is now {new} (read from {old} for one more "
            "release; rename it in the file or the environment variable)",
            extra={"deprecated_key": old, "key": new},
        )
    return raw if moved is None else moved
