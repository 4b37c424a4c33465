"""The development stack's settings: out of the production
model, still read from the same file and environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.common.config import ConfigError, IcekeeperConfig, load_config
from icekeeper.demo import demo_config
from icekeeper.localstack.settings import StackConfig, stack_settings


def test_the_production_model_has_no_stack_section() -> None:
    assert "stack" not in IcekeeperConfig.model_fields
    assert "stack" not in load_config(None, environ={}).model_dump()


def test_a_files_stack_section_reaches_the_stack_and_no_service(tmp_path: Path) -> None:
    path = tmp_path / "dev.yaml"
    path.write_text("stack: {kafka_port: 19092, start_timeout: 5m}\n", encoding="utf-8")
    config = load_config(path, environ={"ICEKEEPER__STACK__REGISTRY_PORT": "18081"})
    stack = stack_settings(config)
    assert (stack.kafka_port, stack.registry_port, stack.start_timeout) == (19092, 18081, 300.0)
    assert stack.azurite_queue_port == StackConfig().azurite_queue_port
    # A tool that rebuilds the config from its dump keeps the section.
    assert stack_settings(demo_config(config)).kafka_port == 19092


def test_without_a_stack_section_the_stack_takes_its_defaults() -> None:
    assert stack_settings(load_config(None, environ={})) == StackConfig()
    assert stack_settings(IcekeeperConfig()) == StackConfig()


def test_a_bad_stack_value_names_the_key_and_the_variable() -> None:
    config = load_config(None, environ={"ICEKEEPER__STACK__KAFKA_PORT": "ninety"})
    with pytest.raises(ConfigError) as error:
        stack_settings(config)
    assert "ICEKEEPER__STACK__KAFKA_PORT (stack.kafka_port)" in str(error.value)


def test_a_misspelt_stack_key_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "dev.yaml"
    path.write_text("stack: {kafka_prot: 19092}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        stack_settings(load_config(path, environ={}))
    assert f"{path}: stack.kafka_prot: unknown key" in str(error.value)
