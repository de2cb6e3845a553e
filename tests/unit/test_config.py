"""The settings model: defaults mirrored by configs/continuum.yaml, file and
environment overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_continuum.config import (
    ConfigError,
    ContinuumConfig,
    additional_config_arg,
    config_from_vllm,
    load_config,
)

DEFAULTS_FILE = Path(__file__).resolve().parents[2] / "configs" / "continuum.yaml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("CONTINUUM_"):
            monkeypatch.delenv(key)


def test_yaml_mirrors_the_model_defaults():
    assert yaml.safe_load(DEFAULTS_FILE.read_text()) == ContinuumConfig().model_dump()


def test_file_then_env_override(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("default_ttl_s: 4\nmax_ttl_s: 12\ntool_ttl_s: {search: 7}\n")
    monkeypatch.setenv("CONTINUUM_CONFIG", str(path))
    monkeypatch.setenv("CONTINUUM_MAX_TTL_S", "20")
    cfg = load_config()
    assert (cfg.default_ttl_s, cfg.max_ttl_s, cfg.tool_ttl_s) == (4, 20, {"search": 7})


def test_nested_env_override(monkeypatch):
    monkeypatch.setenv("CONTINUUM_TOOL_TTL_S", '{"search": 5.5}')
    assert load_config().tool_ttl_s == {"search": 5.5}


@pytest.mark.parametrize(
    "env, field",
    [
        ({"CONTINUUM_MAX_PINNED_FRACTION": "1.5"}, "max_pinned_fraction"),
        ({"CONTINUUM_DEFAULT_TTL_S": "-1"}, "default_ttl_s"),
        ({"CONTINUUM_TTL_POLICY": "sometimes"}, "ttl_policy"),
        ({"CONTINUUM_TOOL_TTL_S": '{"x": -3}'}, "tool_ttl_s"),
    ],
)
def test_invalid_values_name_the_field(monkeypatch, env, field):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=field):
        load_config()


def test_unknown_field_in_file_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("default_ttl: 4\n")
    monkeypatch.setenv("CONTINUUM_CONFIG", str(path))
    with pytest.raises(ConfigError, match="default_ttl"):
        load_config()


def test_missing_file_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CONTINUUM_CONFIG", "/nonexistent/continuum.yaml")
    with pytest.raises(ConfigError, match="does not name a readable YAML file"):
        load_config()


# ------------------------------------------------- vLLM's --additional-config
def _vllm(additional):
    """What the scheduler reads off vLLM's config: only `additional_config`."""
    from types import SimpleNamespace

    return SimpleNamespace(additional_config=additional)


def test_additional_config_beats_env_which_beats_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("default_ttl_s: 4\nmax_ttl_s: 12\nmax_queue_delay_s: 3\n")
    monkeypatch.setenv("CONTINUUM_MAX_TTL_S", "20")
    monkeypatch.setenv("CONTINUUM_DEFAULT_TTL_S", "5")
    cfg = config_from_vllm(_vllm({"continuum": {"config_file": str(path), "default_ttl_s": 6}}))
    assert (cfg.default_ttl_s, cfg.max_ttl_s, cfg.max_queue_delay_s) == (6, 20, 3)


def test_without_a_continuum_section_the_other_sources_apply(monkeypatch):
    monkeypatch.setenv("CONTINUUM_MAX_TTL_S", "20")
    assert config_from_vllm(_vllm(None)).max_ttl_s == 20
    assert config_from_vllm(_vllm({"other_plugin": {"x": 1}})).max_ttl_s == 20


def test_the_serve_arguments_round_trip():
    import json

    flag, value = additional_config_arg({"ttl_policy": "fixed", "tool_ttl_s": {"ls": 2}})
    assert flag == "--additional-config"
    cfg = config_from_vllm(_vllm(json.loads(value)))
    assert (cfg.ttl_policy, cfg.tool_ttl_s) == ("fixed", {"ls": 2})


@pytest.mark.parametrize(
    "section, match",
    [
        ({"max_ttl_s": -1}, "max_ttl_s"),
        ({"max_tl_s": 1}, "max_tl_s"),
        ("[1, 2]", "must be an object"),
        ("{not json", "continuum"),
        ({"config_file": "/nonexistent.yaml"}, "config_file='/nonexistent.yaml' does not name"),
    ],
)
def test_bad_additional_config_is_a_clear_error(section, match):
    with pytest.raises(ConfigError, match=match):
        config_from_vllm(_vllm({"continuum": section}))


def test_use_env_false_ignores_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("max_ttl_s: 12\n")
    monkeypatch.setenv("CONTINUUM_MAX_TTL_S", "20")
    monkeypatch.setenv("CONTINUUM_CONFIG", str(path))
    default = ContinuumConfig.model_fields["max_ttl_s"].default
    assert load_config(use_env=False, default_ttl_s=3).max_ttl_s == default != 20
