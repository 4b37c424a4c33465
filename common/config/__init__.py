"""Config: one typed model (`model.py`), loaded from YAML or seed-000 properties (`loader.py`)."""

from icekeeper.common.config.loader import ConfigError, load_config
from icekeeper.common.config.model import IcekeeperConfig

__all__ = ["ConfigError", "IcekeeperConfig", "load_config"]
