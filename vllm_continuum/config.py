"""The one settings model of the plugin.

Sources, highest priority first:

1. vLLM's own `--additional-config '{"continuum": {"max_ttl_s": 10}}'`
   (`vllm_config.additional_config["continuum"]`), the way vLLM passes
   settings to plugins; it may name a YAML file as `config_file`;
2. environment variables `CONTINUUM_<FIELD>` (nested with `__`, e.g.
   `CONTINUUM_TOOL_TTL_S='{"search": 5}'`), for deployments that set them;
3. the YAML file (`config_file` above, else the one `CONTINUUM_CONFIG` names);
4. the defaults below, which `configs/continuum.yaml` mirrors (a test keeps
   the two identical).

The engine core reads it once at start-up: a bad value stops the server with
a message naming the field, rather than misbehaving later. Callers that
build a scheduler themselves (the simulator) pass a `ContinuumConfig`.
"""

from __future__ import annotations

import math

import contextvars
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

CONFIG_ENV_VAR = "CONTINUUM_CONFIG"
ADDITIONAL_CONFIG_KEY = "continuum"  # --additional-config '{"continuum": {...}}'
CONFIG_FILE_KEY = "config_file"  # the YAML file, named inside that section

# Client spellings of a session, in the order they are tried (docs/clients.md):
# the clients' own session headers, then older and proxy headers, then body
# fields (the recorded clients send the same id in each spelling they use).
# Text-mode agents' tool calls: mini-swe-agent's fenced command block (its
# action_regex is ```mswea_bash_command\s*\n(.*?)\n```).
TEXT_TOOL_CALL_PATTERNS = (r"```mswea_bash_command[ \t]*\n\s*([\w./-]+)",)
CLIENT_BODY_FIELDS = ("prompt_cache_key", "metadata.user_id", "nvext.session_control.session_id")
CLIENT_SESSION_SOURCES = (
    "header:x-claude-code-session-id",
    "header:session-id",
    "header:thread-id",
    "header:session_id",
    "header:conversation_id",
    "header:x-litellm-session-id",
    "header:x-session-affinity",
    "body:prompt_cache_key",
    "body:metadata.user_id",
    "body:nvext.session_control.session_id",
)

# The sources of the `load_config` call in progress, (YAML file, read the
# environment?): pydantic-settings asks for sources on a classmethod, without
# the call's arguments.
_sources: contextvars.ContextVar[tuple[str | None, bool]] = contextvars.ContextVar(
    "sources", default=(None, True)
)


# Settings for comparing rules (the lab's matrices, A/B runs): what ships is
# what measured best, and an operator has no reason to change these.
EXPERIMENTAL = frozenset({
    "pressure_policy", "reloadable_pins_yield", "queue_order", "admission", "cold_start_samples",
    "duration_estimator", "prior_samples", "pin_cost", "duration_history",
    "queueing_window", "program_window", "prefill_profile",
})


class ContinuumConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONTINUUM_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    ttl_policy: Literal["continuum", "fixed", "never", "forever", "hazard"] = Field(
        "hazard",
        description="Where TTLs come from. hazard: until the next turn while the tool may "
        "still return within `max_ttl_s` and that is worth the memory, decided again as the "
        "call runs (a tool that outlasts the cap loses its pin; docs/ttl-model.md). forever: "
        "until the next turn, the last turn or pressure, bounded by `max_ttl_s`. continuum: "
        "the paper's cost/benefit model, learned online, at the cost `pin_cost` says. fixed: "
        "`tool_ttl_s`, else `default_ttl_s`. never: no pins (stock behaviour, for A/B runs).",
    )
    default_ttl_s: float = Field(2.0, ge=0, description="fixed: TTL of a tool without its own entry.")
    tool_ttl_s: dict[str, float] = Field(
        default_factory=dict, description="fixed: per-tool TTL in seconds, by tool name."
    )
    max_ttl_s: float = Field(
        30.0, ge=0, description="Upper bound on every TTL, hints included."
    )
    pressure_policy: Literal["hold", "yield"] = Field(
        "hold",
        description="hold (the paper's, measured better under memory pressure): pins "
        "under the cap are kept while other work runs; released only when nothing "
        "runs and the queue head cannot be admitted. yield: a waiting request that "
        "cannot be admitted because blocks are pinned gets them; pins are released, "
        "latest-arriving session first, until it fits. Both release pins before any "
        "preemption.",
    )
    reloadable_pins_yield: bool = Field(
        True,
        description="With vLLM's KV offload to host memory: under hold, a pin whose loss "
        "costs a reload of at most a quarter of its prefill gives way to waiting requests as "
        "under yield, when the host tier has been serving its tenant's lost pins' next turns "
        "(80% of their prompt tokens found cached; until 16 of them came, of the prompts of "
        "pinned turns, held by the host tier as their pins were handed over). Without a host "
        "tier it changes nothing.",
    )
    queue_order: Literal["program_fcfs", "sessionless_first", "pinned_fcfs", "fcfs"] = Field(
        "sessionless_first",
        description="program_fcfs (the paper's): preempted requests, then the next turns "
        "of pinned contexts, then by the program's first arrival, with the waiting bound "
        "`max_queue_delay_s`. sessionless_first: the same, but requests without a session "
        "(one-turn programs, so the shortest) before sessions' turns, by their arrival. "
        "pinned_fcfs: the same lanes, but the rest by the request's own arrival, as stock "
        "(only turns whose pin is held go ahead). fcfs: vLLM's own queue and order (with "
        "ttl_policy: never, exactly stock vLLM).",
    )
    admission: Literal["program", "request"] = Field(
        "program",
        description="program: programs are served in arrival order when their contexts do "
        "not all fit (a pin holds memory only against programs that arrived after its own; "
        "a new program waits for room rather than thrash everyone); requests without a "
        "session keep the waiting bound `max_queue_delay_s`, a session's bound is the "
        "programs ahead of it (docs/guarantees.md). request: every request has the waiting "
        "bound, and pins under hold give way to none before it passes.",
    )
    program_order: Literal["arrival", "service"] = Field(
        "arrival",
        description="admission: program: the order of programs in the regular lane. "
        "arrival: by the program's first arrival (the paper's). service: by the service a "
        "program has received (prefilled and decoded tokens, in a few doubling levels), the "
        "least first, then by arrival: a new program, and a one-turn program, goes before "
        "the remaining turns of long ones (Autellix's PLAS); the turn bound "
        "`max_turn_delay_s` keeps a long program from waiting behind later ones longer.",
    )
    program_service_levels: int = Field(
        8, ge=2, le=64,
        description="program_order: service: the levels programs are ranked in: 0 for a "
        "program served nothing yet, then one per doubling of its service past 4,096 tokens. "
        "2: a program's first turn before other programs' remaining turns, the rest by "
        "arrival.",
    )
    max_queue_delay_s: float = Field(
        1.0,
        ge=0,
        description="Waiting bound (of requests without a session under admission: program; "
        "of every request under admission: request): once our queue order or our pins have "
        "delayed a request this long (from the first time a later arrival went ahead of it, "
        "or pins held memory it needed), no later arrival is admitted before it and pins give "
        "way to it under either pressure policy.",
    )
    max_turn_delay_s: float = Field(
        300.0,
        ge=0,
        description="Turn bound (of a session's turns under admission: program): once "
        "pins of later programs have kept memory a turn needed (or a later program's turn "
        "went ahead of it from the regular lane) for this long, it goes before every "
        "request of a later program and their pins give way to it. A turn then waits for "
        "earlier programs only (docs/guarantees.md).",
    )
    max_turn_aging_s: float = Field(
        120.0,
        ge=0,
        description="Aging of a session's turn against requests without a session (which "
        "`sessionless_first` queues first): once those that arrived after it have gone "
        "ahead of it for this long, it goes before those of them that are not overdue "
        "(docs/guarantees.md). Lower it to bound agents' waits behind sessionless floods "
        "more tightly; at 30 s it cost one-shots' tail latency under overload.",
    )
    program_precedence_s: float = Field(
        3600.0,
        gt=0,
        description="admission: program: how long a program keeps its place ahead of later "
        "programs, from its first arrival. Past it its turns queue by their own arrival and "
        "its pins give way to everyone: an endless session cannot starve the rest.",
    )
    # High by default: pins are the paused part of admitted programs' working
    # sets, and a cap below them makes those programs prefill again, the thrash
    # program admission exists to stop. What keeps pins from starving others is
    # the release rules, not the caps (docs/guarantees.md).
    max_pinned_fraction: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Cap on pinned blocks as a fraction of the KV pool. Pins never cause a "
        "preemption and give way past the waiting bound whatever this is; lower it to keep "
        "memory pins can never hold (e.g. beside untrusted sessions).",
    )
    max_session_pinned_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Cap on one session's pinned blocks, fraction of the KV pool (the "
        "smaller of this and max_pinned_fraction binds): a longer context keeps only its "
        "first blocks pinned (its prefix).",
    )
    cold_start_samples: int = Field(
        100, ge=0, description="continuum: K, samples needed before a CDF is trusted."
    )
    duration_estimator: Literal["cliff", "shrunk"] = Field(
        "cliff",
        description="continuum: a tool's duration CDF. cliff (the paper's): the all-tools "
        "CDF until the tool has `cold_start_samples` samples, then its own. shrunk: its "
        "own CDF shrunk toward the all-tools one (and that toward Exp(1)) by "
        "`prior_samples` pseudo-samples, so a rare slow tool earns its own TTL after a "
        "few calls.",
    )
    prior_samples: float = Field(
        8.0,
        gt=0,
        description="continuum, shrunk: weight of the prior in samples; after this many "
        "calls a tool's own durations carry half the weight.",
    )
    pin_cost: Literal["always", "pressure", "demand"] = Field(
        "demand",
        description="continuum: when a pin's memory is charged. demand: only while a request "
        "entitled to it (a preempted one, or one with the waiting bound: under admission: "
        "program, one without a session) needs its blocks: the pin lasts until the next turn "
        "(within max_ttl_s), and once such a request needs its blocks it keeps them only for "
        "the TTL Eq. 2 gives at full cost. "
        "pressure: the same, and the TTL itself is Eq. 2 with the cost scaled by the share "
        "of the pin's own blocks those requests need beyond the free pool when it is made. "
        "always (the paper's Eq. 2): all of it, always.",
    )
    duration_history: int = Field(
        1000, ge=1, description="continuum: newest tool durations kept per tool."
    )
    queueing_window: int = Field(
        256, ge=1, description="continuum: turns averaged for T, the queueing delay."
    )
    program_window: int = Field(
        1000, ge=1, description="continuum: finished programs used for eta."
    )
    program_idle_horizon_s: float = Field(
        600.0, gt=0, description="A program with nothing queued, running or pinned this long "
        "counts as finished (it keeps its place while remembered)."
    )
    prefill_profile: str | None = Field(
        None,
        description="continuum: YAML written by `vllm-continuum profile`; "
        "without it, a documented default reload cost.",
    )
    # How a finished turn is read as a tool call (core/tool_calls/): every known
    # family's single-token markers are looked up in the tokenizer with no setting.
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's --tool-call-parser name of the served model (llama3_json, "
        "pythonic, olmo3, xlam, granite, deepseek_v32, ...): brings the formats the engine "
        "core cannot find in the vocabulary, calls written as text (at a message's start) and "
        "markers the tokenizer spells out of ordinary tokens. With the middleware, the "
        "server's own --tool-call-parser is used without this.",
    )
    tool_call_tokens: list[str] = Field(
        default_factory=list,
        description="More tokens whose presence in a finished output marks a tool call (the "
        "name is read from a JSON object right after it: {\"name\": ...}), beyond the known "
        "families' markers, which need no setting.",
    )
    tool_call_token: str | None = Field(
        None,
        min_length=1,
        description="Deprecated: one more tool_call_tokens entry (the known families' "
        "markers, <tool_call> included, are found without it).",
    )
    tool_call_patterns: list[str] = Field(
        default_factory=list,
        description="More regexes with one group (the tool name), searched in a finished "
        "output's text, e.g. the first word of a fenced shell block; they add to the "
        "built-in ones (default_tool_call_patterns).",
    )
    default_tool_call_patterns: bool = Field(
        True,
        description="Also search the built-in patterns: mini-swe-agent's text mode (a "
        "```mswea_bash_command block; the tool is the command's first word). false "
        "removes them.",
    )
    tool_result_token: str = Field(
        "<tool_response>",
        min_length=1,
        description="Token that wraps a tool result in a prompt (Hermes-style templates): "
        "a prompt holding more of them than this engine saw the session produce counts as "
        "an affinity miss (continuum_affinity_misses_total).",
    )
    max_hint_tool_name_length: int = Field(
        128, ge=1, description="Longer `continuum_tool` hints are ignored as invalid."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING"] | None = Field(
        None,
        description="Level of the vllm.continuum logger (DEBUG logs every TTL decision); "
        "None follows vLLM's.",
    )
    max_tracked_sessions: int = Field(
        100_000, ge=1, description="Programs (a session id's contexts) remembered for their place "
        "and calls (segmented LRU)."
    )
    # What the API server reads from agent clients (vllm_continuum/frontend/, loaded with
    # --middleware vllm_continuum.frontend.middleware.ClientSessionMiddleware).
    client_session_sources: list[str] = Field(
        default_factory=lambda: list(CLIENT_SESSION_SOURCES),
        description="Where a request without vLLM's own session id (body `session_id`, "
        "header `X-Session-ID`, `vllm_xargs.session_id`) finds its session, first match "
        "wins: `header:<name>`, or `body:` one of prompt_cache_key, metadata.user_id "
        "(Claude Code's session in it only), nvext.session_control.session_id. Remove an "
        "entry to ignore that spelling, add `header:<name>` for another; [] turns it off "
        "(docs/clients.md).",
    )
    client_ttls: bool = Field(
        True,
        description="Translate the cache lifetimes clients send (Anthropic "
        "`cache_control.ttl`, `prompt_cache_retention`, Dynamo `nvext`) into "
        "`continuum_ttl_s` / `continuum_last_turn` hints (capped by `max_ttl_s`).",
    )

    @field_validator("client_session_sources")
    @classmethod
    def _sources_are_known(cls, value: list[str]) -> list[str]:
        import re

        for source in value:
            kind, _, name = source.partition(":")
            if not (kind == "header" and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name)
                    or kind == "body" and name in CLIENT_BODY_FIELDS):
                raise ValueError(
                    f"{source!r}: expected header:<header name> or body:<one of "
                    f"{', '.join(CLIENT_BODY_FIELDS)}>"
                )
        return value

    @field_validator("tool_call_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        import re

        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
            if compiled.groups != 1:
                raise ValueError(f"{pattern!r} must have exactly one group (the tool name)")
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _parser_is_known(cls, value: str | None) -> str | None:
        from vllm_continuum.core.tool_calls.families import PARSERS

        if value is not None and value not in PARSERS:
            raise ValueError(
                f"{value!r} is not a tool parser whose format the scheduler reads; known: "
                f"{', '.join(sorted(PARSERS))}. For another format set tool_call_tokens (its "
                "call token) or tool_call_patterns (a regex)"
            )
        return value

    @property
    def all_tool_call_tokens(self) -> list[str]:
        """`tool_call_tokens` with the deprecated `tool_call_token`."""
        extra = [self.tool_call_token] if self.tool_call_token else []
        return list(dict.fromkeys([*self.tool_call_tokens, *extra]))

    @property
    def all_tool_call_patterns(self) -> list[str]:
        """The built-in patterns (unless removed), then `tool_call_patterns`."""
        builtin = TEXT_TOOL_CALL_PATTERNS if self.default_tool_call_patterns else ()
        return list(dict.fromkeys([*builtin, *self.tool_call_patterns]))

    @field_validator("prefill_profile")
    @classmethod
    def _profile_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"{value!r} is not a file (write one with `vllm-continuum profile`)")
        return value

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
        path, use_env = _sources.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings]
        if use_env:
            sources.append(env_settings)
        if path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def summary(self) -> str:
        """The settings that shape behaviour most, for the start-up log line."""
        keys = ("ttl_policy", "pressure_policy", "queue_order", "admission", "max_queue_delay_s",
                "max_pinned_fraction", "max_ttl_s")
        return " ".join(f"{k}={getattr(self, k)}" for k in keys)

    @model_validator(mode="after")
    def _history_outgrows_cold_start(self) -> ContinuumConfig:
        if self.duration_history <= self.cold_start_samples:
            raise ValueError(
                f"duration_history ({self.duration_history}) must exceed cold_start_samples "
                f"({self.cold_start_samples}), or a tool's own CDF would never be used"
            )
        return self

    @model_validator(mode="after")
    def _tool_call_token_is_deprecated(self) -> ContinuumConfig:
        if self.tool_call_token is not None:
            logging.getLogger("vllm.continuum").warning(
                "continuum: tool_call_token is deprecated: set tool_call_tokens: [%r] "
                "(it is added to them meanwhile; the known families' markers, <tool_call> "
                "included, need neither)", self.tool_call_token)
        return self


class ConfigError(RuntimeError):
    """A configuration the plugin refuses to start with."""


def load_config(
    config_file: str | None = None, *, use_env: bool = True, **overrides: object
) -> ContinuumConfig:
    """Read the config (`overrides` first, see the module's docstring),
    turning validation errors into one readable message. `use_env=False`:
    only `overrides`, `config_file` and the defaults (the simulator's
    schedulers do not depend on the process environment)."""
    path = config_file or (os.environ.get(CONFIG_ENV_VAR) if use_env else None)
    where = f"{CONFIG_FILE_KEY}" if config_file else CONFIG_ENV_VAR
    if path and not Path(path).is_file():
        raise ConfigError(f"{where}={path!r} does not name a readable YAML file.")
    token = _sources.set((path, use_env))
    try:
        return ContinuumConfig(**overrides)
    except ValidationError as exc:
        raise ConfigError(
            f"Invalid vllm-continuum configuration{f' (file {path})' if path else ''}; fix "
            f"these fields in --additional-config '{{\"{ADDITIONAL_CONFIG_KEY}\": {{...}}}}', "
            f"their CONTINUUM_* environment variables or the YAML file:\n{exc}"
        ) from exc
    finally:
        _sources.reset(token)


def config_from_vllm(vllm_config: object) -> ContinuumConfig:
    """The config of a scheduler vLLM builds: `--additional-config`'s
    `continuum` section over the other sources."""
    additional = getattr(vllm_config, "additional_config", None) or {}
    section = additional.get(ADDITIONAL_CONFIG_KEY, {}) if isinstance(additional, Mapping) else {}
    if isinstance(section, str):  # a JSON string inside the JSON, tolerated
        try:
            section = json.loads(section)
        except ValueError as exc:
            raise ConfigError(f"--additional-config {ADDITIONAL_CONFIG_KEY!r}: {exc}") from exc
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"--additional-config's {ADDITIONAL_CONFIG_KEY!r} must be an object of settings, "
            f"e.g. '{{\"{ADDITIONAL_CONFIG_KEY}\": {{\"max_ttl_s\": 10}}}}'; got {section!r}"
        )
    section = dict(section)
    return load_config(section.pop(CONFIG_FILE_KEY, None), **section)


def additional_config_arg(settings: Mapping[str, object] | None, **other: object) -> list[str]:
    """The `vllm serve` arguments that pass `settings` to the plugin (None: no
    continuum section), with `other` top-level keys beside it; none if empty."""
    config = ({ADDITIONAL_CONFIG_KEY: dict(settings)} if settings is not None else {}) | other
    return ["--additional-config", json.dumps(config)] if config else []
