"""`ttl_policy`, resolved once into its policy object (ttl.py, hazard_ttl.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.ttl import (
    ContinuumTTLPolicy,
    FixedTTLPolicy,
    ForeverTTLPolicy,
    NeverTTLPolicy,
    TTLPolicy,
)
from vllm_continuum.core.workload import WorkloadModel

if TYPE_CHECKING:
    from vllm_continuum.config import ContinuumConfig


def make_ttl_policy(config: ContinuumConfig, workload: WorkloadModel) -> TTLPolicy:
    if config.ttl_policy == "never":
        return NeverTTLPolicy(config.max_ttl_s)
    if config.ttl_policy == "forever":
        return ForeverTTLPolicy(config.max_ttl_s)
    if config.ttl_policy == "fixed":
        return FixedTTLPolicy(config.default_ttl_s, config.tool_ttl_s, config.max_ttl_s)
    if config.ttl_policy == "hazard":
        return HazardTTLPolicy.from_config(config, workload)
    profile = PrefillProfile.load_or_default(config.prefill_profile)
    return ContinuumTTLPolicy(
        workload, profile, config.cold_start_samples, config.max_ttl_s,
        prior_samples=config.prior_samples if config.duration_estimator == "shrunk" else None,
        pin_cost=config.pin_cost,
    )
