"""The simulated scheduler for a live `compare` server: the same class with the
same settings.

A `compare` flavour names settings on top of the benchmark's and the
defaults of the day (flavours.py); a `sim` policy label names settings on
top of the paper's (sim/policies.py): `forever` live runs the shipped queue
order, `forever` in the simulator the paper's. Labels would mislead, so the
pairing goes by settings: stock is vLLM's `Scheduler` (`stock`), and every
continuum server is our scheduler (`default`, i.e. no settings of its own)
given the *effective* config that server ran with, every field, as
`compare` recorded it (`continuum_config` in the run's meta). So the
simulation runs what the server ran even after the defaults have changed; a
field the current config no longer knows is dropped, and said.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_continuum.config import ContinuumConfig
from continuum_lab.results import RunResult

# sim/policies.py's names: vLLM's own scheduler, and ours with no settings but those given.
STOCK_POLICY = "stock"
CONTINUUM_POLICY = "default"


def _text(value) -> str:
    """A setting as the simulator's CONTINUUM_*-style settings take it (the inverse of
    sim/policies.py's sim_config: JSON for mappings and lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def sim_policy(run: RunResult, run_dir: Path) -> tuple[str, dict[str, str], list[str]]:
    """(sim policy, its settings, notes) for the server that made `run`."""
    config = run.meta.get("continuum_config")
    if config is None:
        if run.meta.get("continuum_settings"):
            raise SystemExit(f"{run.label}: recorded without its effective config; run compare again")
        return STOCK_POLICY, {}, []
    known = ContinuumConfig.model_fields
    notes = [f"{run.label}: setting {k} (recorded) is unknown to this version: not simulated"
             for k in config if k not in known]
    notes += [f"{run.label}: setting {k} is new since the run: its default is simulated"
              for k in known if k not in config]
    settings = {k.upper(): _text(v) for k, v in config.items() if k in known and v is not None}
    profile = config.get("prefill_profile")
    if profile:
        found = next((p for p in (Path(profile), Path(run_dir) / Path(profile).name) if p.is_file()), None)
        if found is None:
            settings.pop("PREFILL_PROFILE")
            notes.append(f"{run.label}: its prefill profile {profile} is gone: the cost model's is used")
        else:
            settings["PREFILL_PROFILE"] = str(found)
    return CONTINUUM_POLICY, settings, notes


def describe(policy: str, settings: dict[str, str]) -> str:
    """The simulated scheduler in a few words, for the report's `sim` column."""
    if policy == STOCK_POLICY:
        return "vLLM"
    return f"ours: {settings.get('TTL_POLICY')}, {settings.get('QUEUE_ORDER')}, {settings.get('PRESSURE_POLICY')}"
