"""Synthetic agent workloads: a YAML spec in, a seeded trace (trace_format.py) out.

A spec (see `configs/workloads/*.yaml` in this package) gives the statistics of the paper's
Table 2 for one agent (turns per program, tool time, tokens per program)
and what the table leaves open (the first prompt, tokens generated per
turn, which tools run and how long each takes). Every positive quantity is
drawn from a log-normal with the configured mean and standard deviation
(long-tailed, as the paper observes for tool times); turns per program from
a rounded normal.

**Tokens per program** is read as the sum of the prompt tokens of a
program's turns (what a server without prefix caching prefills), the
quantity an LLM-call trace yields when every call's `prompt_tokens` is added
up. Each program's prompts grow as an agent's history does (trace_format.py); the
tool results appended between turns are sized so that the program's sum of
prompts is its drawn total. `tokens_per_program_is: final_context` reads the
figure as the last turn's context instead (a sensitivity check).

Program arrivals are a Poisson process at `arrival_rate` programs/s. Each
program is drawn from its own random stream (seed, program index), so a
longer run extends a shorter one, and the arrival times from another.

**One-shot requests** (`one_shot:`, optional): chat traffic without a
session beside the agents, each a single turn (trace_format.py), arriving as a
Poisson process of their own at `one_shot.arrival_rate` requests/s from the
run's start until the last agent program arrives (or `one_shot.until_s`), with prompt and output
sizes from their own distributions. Their arrivals and sizes come from
streams of their own, so adding them to a spec leaves its agents exactly as
they were. `base: NAME` takes every field of another spec not given here:
a mixed spec is an agent spec plus its chat traffic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from continuum_lab.configs import WORKLOAD_DIR, named_yaml
from continuum_lab.trace_format import Program, Trace, Turn


class Dist(BaseModel):
    """A positive quantity: log-normal with this mean and std, clipped to [min, max]."""

    model_config = ConfigDict(extra="forbid")
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: float = 0.0
    max: float = math.inf

    def sample(self, rng: np.random.Generator, size: int | None = None):
        if self.std == 0:
            x = np.full(size, self.mean) if size is not None else self.mean
        else:
            sigma2 = math.log1p((self.std / self.mean) ** 2)
            mu = math.log(self.mean) - sigma2 / 2
            x = rng.lognormal(mu, math.sqrt(sigma2), size)
        return np.clip(x, self.min, self.max)


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = Field(gt=0, description="relative frequency among tool calls")
    duration_s: Dist
    note: str = ""


class TurnsDist(BaseModel):
    """Turns per program: a normal rounded to an integer, clipped to [min, max]."""

    model_config = ConfigDict(extra="forbid")
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = 1
    max: int = 1000


class OneShotSpec(BaseModel):
    """Requests without a session beside the agents (chat traffic), one turn each."""

    model_config = ConfigDict(extra="forbid")
    arrival_rate: float = Field(gt=0, description="requests per second (Poisson)")
    until_s: float | None = Field(
        None, gt=0, description="arrivals until this time (default: the last agent program's "
        "arrival); for a batch that arrives at once, chat traffic that goes on while it runs")
    prompt_tokens: Dist
    output_tokens: Dist
    session: bool = Field(
        False, description="each request carries a session id of its own: a one-turn program "
        "(as every request of a client that sends `prompt_cache_key` or a session header is)")
    note: str = ""


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    source: str = ""
    num_programs: int = Field(100, ge=1)
    arrival_rate: float = Field(0.1, gt=0, description="programs per second (Poisson)")
    seed: int = 0
    turns: TurnsDist
    tokens_per_program: Dist
    tokens_per_program_is: Literal["prompt_sum", "final_context"] = "prompt_sum"
    first_prompt_tokens: Dist
    output_tokens: Dist
    # Relative spread of the tool results appended between turns (their
    # sizes are scaled to meet the program's token total).
    tool_result_cv: float = Field(1.0, ge=0)
    min_tool_result_tokens: int = Field(8, ge=0)
    max_context_tokens: int | None = Field(None, ge=64)
    tools: list[Tool] = Field(min_length=1)
    one_shot: OneShotSpec | None = None
    # Table 2 of the paper, for the statistics test (not used to generate).
    paper: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names: {names}")
        return self

    # --- derived --------------------------------------------------------------
    def tool_mixture(self) -> tuple[float, float]:
        """Mean and std of one tool call's duration, from the spec (exact, before clipping)."""
        w = np.array([t.weight for t in self.tools])
        w = w / w.sum()
        m = np.array([t.duration_s.mean for t in self.tools])
        s = np.array([t.duration_s.std for t in self.tools])
        mean = float((w * m).sum())
        second = float((w * (s * s + m * m)).sum())
        return mean, math.sqrt(max(0.0, second - mean * mean))

    def with_overrides(self, **overrides) -> WorkloadSpec:
        data = self.model_dump()
        data.update({k: v for k, v in overrides.items() if v is not None})
        return WorkloadSpec.model_validate(data)

    def generate(self) -> Trace:
        return generate(self)


def load_spec(name_or_path: str | Path) -> WorkloadSpec:
    """A spec by path, or by name from the shipped specs (`swebench` -> swebench.yaml)."""
    return WorkloadSpec.model_validate(_spec_data(name_or_path))


def _spec_data(name_or_path: str | Path) -> dict:
    """A spec's fields, those of its `base` spec filled in."""
    path = named_yaml(name_or_path, WORKLOAD_DIR, "workload")
    data = yaml.safe_load(path.read_text())
    base = data.pop("base", None)
    return {**_spec_data(base), **data} if base else data


def load_trace(workload: str | Path, **overrides) -> Trace:
    """A recorded trace (.jsonl) or a trace generated from a spec, with overrides
    (num_programs, arrival_rate, seed) for specs."""
    path = Path(workload)
    if path.suffix == ".jsonl" and path.is_file():
        trace = Trace.load(path)
        n = overrides.get("num_programs")
        return trace if n is None else trace.head(n)
    return load_spec(workload).with_overrides(**overrides).generate()


def trace_for_run(workload: str | Path, out_dir: Path, **overrides) -> Trace:
    """The trace a benchmark run replays, saved into its output directory first,
    so that every run can be replayed again exactly."""
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = load_trace(workload, **overrides)
    trace.save(out_dir / "trace.jsonl")
    return trace


def _program(spec: WorkloadSpec, index: int, arrival_s: float) -> Program:
    rng = np.random.default_rng([spec.seed, 1, index])
    n = round(rng.normal(spec.turns.mean, spec.turns.std))
    n = max(spec.turns.min, min(spec.turns.max, n))
    total = float(spec.tokens_per_program.sample(rng))
    first = max(1, round(float(spec.first_prompt_tokens.sample(rng))))
    outputs = np.maximum(1, np.rint(spec.output_tokens.sample(rng, n))).astype(int)
    weights = (
        Dist(mean=1.0, std=spec.tool_result_cv).sample(rng, n - 1)
        if n > 1
        else np.zeros(0)
    )
    # prompt(k) = first + sum_{j<k} (outputs[j] + results[j]) for k = 0..n-1 (0-based;
    # results[j] is appended after turn j's tool). Turn k's prompt counts result j
    # for every k > j: (n - 1 - j) times; output j likewise.
    mult = np.arange(n - 1, 0, -1, dtype=float)  # n-1-j for j = 0..n-2
    if spec.tokens_per_program_is == "prompt_sum":
        fixed = n * first + float((mult * outputs[: n - 1]).sum())
        budget = total - fixed
        scale = budget / float((mult * weights).sum()) if n > 1 and weights.sum() > 0 else 0.0
    else:  # the last prompt plus its output is the drawn total
        budget = total - first - float(outputs.sum())
        scale = budget / float(weights.sum()) if n > 1 and weights.sum() > 0 else 0.0
    results = np.maximum(spec.min_tool_result_tokens, np.rint(weights * max(0.0, scale))).astype(int)
    if spec.max_context_tokens is not None:  # shrink results so the last turn fits
        room = spec.max_context_tokens - first - int(outputs.sum())
        if n > 1 and results.sum() > max(0, room):
            results = np.floor(results * max(0, room) / results.sum()).astype(int)
    names = [t.name for t in spec.tools]
    w = np.array([t.weight for t in spec.tools], dtype=float)
    picks = rng.choice(len(names), size=max(0, n - 1), p=w / w.sum())
    turns = []
    for k in range(n):
        new = first if k == 0 else int(results[k - 1])
        if k < n - 1:
            tool = spec.tools[int(picks[k])]
            turns.append(Turn(new, int(outputs[k]), tool.name, float(tool.duration_s.sample(rng))))
        else:
            turns.append(Turn(new, int(outputs[k]), None, 0.0))
    return Program(id=f"{spec.name}-{spec.seed}-{index:05d}", arrival_s=arrival_s, turns=tuple(turns))


def _one_shot_arrivals(spec: WorkloadSpec, until: float) -> list[float]:
    """Poisson arrivals in (0, until], drawn one by one from their own stream so
    that a longer window extends a shorter one."""
    rng = np.random.default_rng([spec.seed, 2])
    arrivals, t = [], 0.0
    while (t := t + float(rng.exponential(1.0 / spec.one_shot.arrival_rate))) <= until:
        arrivals.append(t)
    return arrivals


def _one_shot(spec: WorkloadSpec, index: int, arrival_s: float) -> Program:
    rng = np.random.default_rng([spec.seed, 3, index])
    prompt = max(1, round(float(spec.one_shot.prompt_tokens.sample(rng))))
    output = max(1, round(float(spec.one_shot.output_tokens.sample(rng))))
    return Program(id=f"{spec.name}-{spec.seed}-chat-{index:05d}", arrival_s=arrival_s,
                   turns=(Turn(prompt, output),), one_shot=True, session=spec.one_shot.session)


def generate(spec: WorkloadSpec) -> Trace:
    arrivals_rng = np.random.default_rng([spec.seed, 0])
    gaps = arrivals_rng.exponential(1.0 / spec.arrival_rate, spec.num_programs)
    gaps[0] = 0.0  # the first program starts the run
    arrivals = np.cumsum(gaps)
    programs = [_program(spec, i, float(arrivals[i])) for i in range(spec.num_programs)]
    meta = {
        "workload": spec.name,
        "seed": spec.seed,
        "arrival_rate": spec.arrival_rate,
        "num_programs": spec.num_programs,
        "generator": "continuum_lab.workload_spec",
    }
    if spec.one_shot is not None:
        until = spec.one_shot.until_s or float(arrivals[-1])
        chat = [_one_shot(spec, i, t) for i, t in enumerate(_one_shot_arrivals(spec, until))]
        programs = sorted(programs + chat, key=lambda p: (p.arrival_s, p.id))
        meta |= {"one_shot_rate": spec.one_shot.arrival_rate, "one_shot_requests": len(chat)}
    return Trace(programs, meta)
