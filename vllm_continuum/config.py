"""The one settings model of the plugin.

Sources, highest priority first: environment variables `CONTINUUM_<FIELD>`
(nested with `__`, e.g. `CONTINUUM_TOOL_TTL_S='{"search": 5}'`), the YAML
file named by `CONTINUUM_CONFIG`, then the defaults below, which
`configs/continuum.yaml` mirrors (a test keeps the two identical).
The engine core reads it once at start-up: a bad value stops the server with
a message naming the field, rather than misbehaving later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

CONFIG_ENV_VAR = "CONTINUUM_CONFIG"


class ContinuumConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONTINUUM_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    ttl_policy: Literal["fixed", "never"] = Field(
        "fixed",
        description="Where TTLs come from. fixed: per-tool TTL from `tool_ttl_s`, "
        "else `default_ttl_s`. never: stock vLLM behaviour (no pins), for A/B runs.",
    )
    default_ttl_s: float = Field(2.0, ge=0, description="TTL of a tool without its own entry.")
    tool_ttl_s: dict[str, float] = Field(
        default_factory=dict, description="Per-tool TTL in seconds, by tool name."
    )
    max_ttl_s: float = Field(
        30.0, ge=0, description="Upper bound on every TTL, hints included."
    )
    pressure_policy: Literal["yield"] = Field(
        "yield",
        description="yield: a waiting request that cannot be admitted because "
        "blocks are pinned gets them; pins are released, latest-arriving "
        "session first, until it fits.",
    )
    max_pinned_fraction: float = Field(
        0.5, gt=0, le=1, description="Cap on pinned blocks as a fraction of the KV pool."
    )
    tool_call_token: str = Field(
        "<tool_call>",
        min_length=1,
        description="Token whose presence in a finished output marks a tool call.",
    )
    max_hint_tool_name_length: int = Field(
        128, ge=1, description="Longer `continuum_tool` hints are ignored as invalid."
    )
    max_tracked_sessions: int = Field(
        100_000, ge=1, description="Sessions remembered for arrival order (LRU)."
    )

    @field_validator("tool_ttl_s")
    @classmethod
    def _ttls_are_non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {tool: ttl for tool, ttl in value.items() if not ttl >= 0}
        if bad:
            raise ValueError(f"TTLs must be >= 0 seconds, got {bad}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV_VAR)
        if path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def ttl_cap(self, ttl_s: float) -> float:
        return min(ttl_s, self.max_ttl_s)


class ConfigError(RuntimeError):
    """A configuration the plugin refuses to start with."""


def load_config(**overrides: object) -> ContinuumConfig:
    """Read the config, turning validation errors into one readable message."""
    path = os.environ.get(CONFIG_ENV_VAR)
    if path and not Path(path).is_file():
        raise ConfigError(f"{CONFIG_ENV_VAR}={path!r} does not name a readable YAML file.")
    try:
        return ContinuumConfig(**overrides)
    except ValidationError as exc:
        where = f" (file {path})" if path else ""
        raise ConfigError(
            f"Invalid vllm-continuum configuration{where}; fix these fields or their "
            f"CONTINUUM_* environment variables:\n{exc}"
        ) from exc
