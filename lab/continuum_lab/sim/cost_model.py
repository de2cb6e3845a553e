"""How long one engine step takes, from what the scheduler put in the batch.

A cost model is a YAML file in `configs/cost_models/` (in this package) with the modelled
server's scheduler limits, its KV pool in blocks, and one of two step-time
formulas. For a step whose batch holds requests i with n_i new tokens on top
of c_i tokens already in their KV cache (a decode has n_i = 1):

    T     = sum n_i                                 tokens computed
    pairs = sum n_i * c_i + n_i * (n_i + 1) / 2     (query, key) pairs of causal attention
    kv    = sum (c_i + n_i)                         KV entries read
    decode_kv = sum over decodes of c_i             KV entries the decodes read

- `roofline` (a GPU, from its datasheet and the model's shape):
      step = overhead + max(compute, memory)
      compute = (flops_per_token * T + attn_flops_per_pair * pairs) / (peak_flops * mfu)
      memory  = (weight_bytes + kv_bytes_per_token * kv) / (peak_bandwidth * bandwidth_efficiency)
- `linear` (fitted on a machine: `vllm-continuum calibrate`, or from a
  `profile` by `fit-cost-model`):
      step = step_s + per_token_s * T + per_pair_s * pairs + per_seq_s * (decoding requests)
             + per_decode_kv_s * decode_kv
  A prefill chunk reads each cached KV entry once for all its queries; a
  decode reads its whole context for one query, so its attention is bound
  by memory, not arithmetic, and costs more per pair: `per_decode_kv_s` is
  that extra, measured on decodes of distinct contexts (calibration/probes.py).

`api_overhead_s` is the time a request spends outside the engine's steps
(HTTP, streaming, the API server's queues), measured by `calibrate`: the
simulator models engine steps only and does not add it; `predict` does,
when it sets a simulation beside a live run.

Every constant of a shipped cost model is written in its file with its
source or marked as an assumption.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field

from vllm_continuum.core.prefill_profile import PrefillProfile
from continuum_lab.configs import COST_MODEL_DIR, named_yaml


class Roofline(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flops_per_token: float = Field(gt=0)
    attn_flops_per_pair: float = Field(ge=0)
    weight_bytes: float = Field(ge=0)
    kv_bytes_per_token: float = Field(ge=0)
    peak_flops: float = Field(gt=0)
    mfu: float = Field(gt=0, le=1)
    peak_bandwidth: float = Field(gt=0)
    bandwidth_efficiency: float = Field(gt=0, le=1)
    overhead_s: float = Field(ge=0)


class Linear(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    per_pair_s: float = Field(ge=0)
    per_seq_s: float = Field(0.0, ge=0)
    per_decode_kv_s: float = Field(0.0, ge=0)


class StepFeatures(NamedTuple):
    """What a step's time depends on (the module docstring's T, pairs, kv), and
    its decoding requests: the one place both the step-time formulas and the
    calibration's fit (continuum_lab/calibration/fit.py) read a batch."""

    tokens: float
    pairs: float
    kv: float
    decodes: float
    decode_kv: float

    @classmethod
    def of(cls, batch: Iterable[tuple[int, int]]) -> StepFeatures:
        """batch: (new tokens, tokens already cached) per scheduled request."""
        tokens = pairs = kv = decodes = decode_kv = 0.0
        for n, c in batch:
            tokens += n
            pairs += n * c + n * (n + 1) / 2
            kv += c + n
            if n == 1 and c > 0:
                decodes += 1
                decode_kv += c
        return cls(tokens, pairs, kv, decodes, decode_kv)

    def __add__(self, other: StepFeatures) -> StepFeatures:  # several steps' sum
        return StepFeatures(*(a + b for a, b in zip(self, other)))


class CostModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str = ""
    kind: Literal["roofline", "linear"]
    block_size: int = Field(16, ge=1)
    num_gpu_blocks: int = Field(ge=2, description="KV pool of the modelled server, in blocks")
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    max_model_len: int = Field(ge=16)
    roofline: Roofline | None = None
    linear: Linear | None = None
    api_overhead_s: float = Field(
        0.0, ge=0, description="per request, outside the engine's steps (measured by calibrate; "
        "the simulator does not add it, predict does)")
    calibration: dict | None = Field(
        None, description="how `calibrate` measured it: command, date, machine, load, points, error")

    @property
    def headline(self) -> str:
        """The description's first sentence (what the model is, how it was obtained),
        for the foot of a report that used it."""
        return self.description.split(". ")[0].rstrip(".") + "." if self.description else ""

    def step_time(self, batch: list[tuple[int, int]]) -> float:
        """batch: (new tokens, tokens already cached) per scheduled request."""
        f = StepFeatures.of(batch)
        if self.kind == "roofline":
            r = self.roofline
            compute = (r.flops_per_token * f.tokens + r.attn_flops_per_pair * f.pairs) / (
                r.peak_flops * r.mfu)
            memory = (r.weight_bytes + r.kv_bytes_per_token * f.kv) / (
                r.peak_bandwidth * r.bandwidth_efficiency
            )
            return r.overhead_s + max(compute, memory)
        lin = self.linear
        return (lin.step_s + lin.per_token_s * f.tokens + lin.per_pair_s * f.pairs
                + lin.per_seq_s * f.decodes + lin.per_decode_kv_s * f.decode_kv)

    def prefill_steps(self, num_tokens: int, cached: int = 0) -> list[tuple[int, int]]:
        """The steps of a lone prefill of num_tokens on top of `cached` tokens, chunked
        as the scheduler chunks it (max_num_batched_tokens per step): (new, cached) each."""
        steps, done = [], 0
        while done < num_tokens:
            n = min(self.max_num_batched_tokens, num_tokens - done)
            steps.append((n, cached + done))
            done += n
        return steps

    def prefill_seconds(self, num_tokens: int, cached: int = 0) -> float:
        """A lone prefill of num_tokens (after `cached` tokens found in the cache)."""
        return sum(self.step_time([step]) for step in self.prefill_steps(num_tokens, cached))

    def prefill_profile(self) -> PrefillProfile:
        """What `vllm-continuum profile` would fit on the modelled server: the
        quadratic through cold prefills of the lengths it measures."""
        from vllm_continuum.tools.prefill_probe import default_lengths

        points = [(n, self.prefill_seconds(n)) for n in default_lengths(self.max_model_len)]
        return PrefillProfile.fit(points, source=f"fitted to cost model {self.name}")

    def max_step_s(self) -> float:
        """A bound on one prefill step: a full chunk at the end of the longest context."""
        n = min(self.max_num_batched_tokens, self.max_model_len)
        return self.step_time([(n, self.max_model_len - n)])

    def with_pool(self, num_blocks: int | None) -> CostModel:
        """The same server with another KV pool (None: this one), as `compare
        --num-blocks` starts it; validated like a loaded model (at least 2 blocks)."""
        if num_blocks is None:
            return self
        return type(self).model_validate({**self.model_dump(), "num_gpu_blocks": num_blocks})

    @property
    def kv_bytes_per_block(self) -> float:
        """Bytes of one KV block (what a host tier copies): the roofline's KV per token."""
        if self.roofline is None:
            raise ValueError(f"cost model {self.name}: a host tier needs a roofline's kv_bytes_per_token")
        return self.roofline.kv_bytes_per_token * self.block_size

    @property
    def pool_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size


def load_cost_model(name_or_path: str | Path) -> CostModel:
    path = named_yaml(name_or_path, COST_MODEL_DIR, "cost model")
    model = CostModel.model_validate(yaml.safe_load(path.read_text()))
    if (model.kind == "roofline") != (model.roofline is not None) or (
        model.kind == "linear"
    ) != (model.linear is not None):
        raise ValueError(f"{path}: kind {model.kind!r} needs its own section")
    return model


def fit_linear(profile: PrefillProfile, decode_step_s: float | None) -> Linear:
    """A linear step model from a prefill profile t(n) = c0 + c1 n + c2 n².

    A cold prefill of n tokens has n(n+1)/2 attention pairs, so per_pair = 2 c2,
    per_token = c1 - c2 (the n/2 part of the pairs). The constant c0 is what one
    request costs end to end beyond its tokens (HTTP, tokenization, detokenizing,
    an engine step): far more than an engine step, whose fixed cost is what a
    decode step shows. So a measured decode step time, if given, sets the step's
    fixed cost (a lone decode at a 256-token context costs what was measured);
    without it, c0 stands in, which overstates every step (say so)."""
    c0, c1, c2 = max(0.0, profile.c0), max(0.0, profile.c1), max(0.0, profile.c2)
    per_pair = 2 * c2
    per_token = max(0.0, c1 - c2)
    step = c0
    if decode_step_s is not None:
        step = max(0.0, decode_step_s - per_token - per_pair * 257)
    return Linear(step_s=step, per_token_s=per_token, per_pair_s=per_pair, per_seq_s=0.0)


def run_fit_cost_model(
    profile_path: Path, out: Path, num_blocks: int, block_size: int,
    decode_step_s: float | None, command: str = "", *,
    max_num_seqs: int = 128, max_num_batched_tokens: int = 2048, max_model_len: int = 4096,
) -> int:
    """Defaults: what vLLM's OpenAI server uses on a CPU (arg_utils.py: 2048
    batched tokens, 128 sequences) and the compare runner's max_model_len."""
    profile = PrefillProfile.load(profile_path)
    linear = fit_linear(profile, decode_step_s)
    data = {
        "name": Path(out).stem,
        "description": (
            f"Fitted from {profile_path} ({profile.source}) by `{command or 'fit-cost-model'}`. "
            "Prefill t(n) = c0 + c1 n + c2 n^2 maps to step = step_s + (c1 - c2) T + 2 c2 pairs, "
            "step_s from the measured decode step (c0 without one: an overestimate); "
            "a decode step costs step_s + per_token_s + per_pair_s * context."
        ),
        "kind": "linear",
        "block_size": block_size,
        "num_gpu_blocks": num_blocks,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
        "linear": linear.model_dump(),
        "profile": {"c0": profile.c0, "c1": profile.c1, "c2": profile.c2,
                    "points": [[n, t] for n, t in profile.points]},
        "decode_step_s": decode_step_s,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(yaml.safe_dump(data, sort_keys=False))
    print(yaml.safe_dump(data, sort_keys=False))
    print(f"wrote {out}")
    return 0
