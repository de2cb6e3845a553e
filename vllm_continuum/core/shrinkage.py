"""A tool's duration distribution without a cliff at K samples.

The paper trusts a tool's own CDF only after K (= 100) samples and uses the
all-tools CDF before that, so a rare slow tool (`pytest` among `cat`s) keeps
the fast tools' short TTLs for a whole run. Here every tool's CDF is shrunk
toward the all-tools one by its sample count, and the all-tools CDF toward
the paper's cold-start prior, Exp(1), by its own (empirical Bayes with a
Dirichlet-process prior of strength k0, in samples):

    F_all'(tau)  = (N F_all(tau) + k0 (1 - exp(-tau))) / (N + k0)
    F_tool'(tau) = (n F_tool(tau) + k0 F_all'(tau)) / (n + k0)

With no samples at all it is Exp(1), the paper's cold start; after k0 calls
a tool's own durations carry half the weight, and the weight moves smoothly.
The paper's eta is shrunk the same way, toward its cold-start value 1, by
the number of finished programs it was measured on (`shrunk_mean`): eta from
two or three programs is noise, and a noisy eta near 0 drops T from B.

`MixedCDF.best_ttl(B)` solves Eq. 2 exactly on such a mixture: the value
F(tau) B - tau is concave between samples and jumps up at each, so its
maximum is at 0, at a sample, or where the Exp(1) part's slope equals 1.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_continuum.core.durations import ToolDurations


@dataclass(frozen=True)
class MixedCDF:
    """F(tau) = sum_i w_i F_i(tau) + w_exp (1 - exp(-tau)); the F_i are
    empirical CDFs given by their sorted samples, the weights add up to 1."""

    parts: tuple[tuple[float, Sequence[float]], ...]
    exp_weight: float = 0.0

    def __call__(self, tau: float) -> float:
        if tau < 0:
            return 0.0
        total = sum(w * bisect.bisect_right(s, tau) / len(s) for w, s in self.parts if s)
        if self.exp_weight:
            total += self.exp_weight * -math.expm1(-tau) if math.isfinite(tau) else self.exp_weight
        return total

    def best_ttl(self, benefit_s: float) -> float:
        """tau* = argmax over tau >= 0 of F(tau) * benefit - tau (ties: shorter).
        An infinite benefit (a pin that costs nothing) waits for the slowest
        sample, or forever if the Exp(1) part has weight."""
        if not benefit_s > 0:  # NaN too
            return 0.0
        samples = [s for w, s in self.parts if w > 0 and s]
        if math.isinf(benefit_s):
            if self.exp_weight > 0:
                return math.inf
            return max((s[-1] for s in samples), default=0.0)
        candidates = heapq.merge(*samples)
        stationary = math.log(self.exp_weight * benefit_s) if self.exp_weight * benefit_s > 1 else 0.0
        best_tau, best_value = 0.0, self(0.0) * benefit_s
        last = None
        for tau in heapq.merge(candidates, [stationary] if stationary > 0 else []):
            if tau >= benefit_s:  # F <= 1: value <= benefit - tau <= 0 <= value at 0
                break
            if tau == last:
                continue
            last = tau
            value = self(tau) * benefit_s - tau
            if value > best_value:
                best_tau, best_value = tau, value
        return best_tau


def shrunk_mean(value: float, num_samples: int, prior: float, prior_samples: float) -> float:
    """`value`, measured on `num_samples`, shrunk toward `prior` by `prior_samples`."""
    return (num_samples * value + prior_samples * prior) / (num_samples + prior_samples)


def shrunk_cdf(durations: ToolDurations, tool: str, prior_samples: float) -> MixedCDF:
    """The tool's CDF shrunk toward the all-tools one, and that toward Exp(1),
    each by `prior_samples` pseudo-samples (see the module's docstring)."""
    k0 = prior_samples
    pooled = durations.all_tools.sorted
    n_all = len(pooled)
    w_all = n_all / (n_all + k0) if n_all + k0 > 0 else 0.0
    history = durations.of(tool)
    own = history.sorted if history is not None else []
    w_own = len(own) / (len(own) + k0) if own else 0.0
    rest = 1.0 - w_own
    return MixedCDF(
        parts=((w_own, own), (rest * w_all, pooled)),
        exp_weight=rest * (1.0 - w_all),
    )
