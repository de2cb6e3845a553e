"""What the server measures about its agent workload, for the TTL model.

- Tool durations, per tool (durations.py), and the calls still running
  (running_calls.py): one out past the cap is a duration known to outlast it.
  Both per tenant (tool_stats.py: a request's `cache_salt`), so that no
  tenant's calls change another's TTLs.

- T: mean queueing delay of turns that came back to find their cache gone
  (pin released, or never made), over a sliding window: what an eviction
  costs in waiting, on top of the prefill.
- Contention: whether a request could not get blocks (a failed allocation,
  pins or not) within the last CONTENTION_WINDOW_S: only then does pinned
  memory keep anyone out.
- eta, the "memoryfulness" of program length: -Corr(k, N - k) over finished
  programs, where k counts turns served so far and N is the program's total.
  Fixed-length programs give 1 (a program that has run long is about to
  end), geometric lengths give 0, and it can be negative.
"""

from __future__ import annotations

import math
from collections import deque

from vllm_continuum.core.tool_stats import Tenant, ToolStats

# How long after a failed allocation the pool counts as contested.
CONTENTION_WINDOW_S = 5.0


class SlidingMean:
    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._sum = 0.0

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value

    @property
    def mean(self) -> float:
        return self._sum / len(self._values) if self._values else 0.0


class Memoryfulness:
    """eta = -Corr(k, N - k), pooled over the turns k = 1..N of the last
    `window` finished programs, from closed-form per-program sums."""

    def __init__(self, window: int) -> None:
        self._programs: deque[int] = deque(maxlen=window)
        # Sums over all (k, r = N - k) samples: n, Σk, Σr, Σk², Σr², Σkr.
        self._sums = [0.0] * 6

    def __len__(self) -> int:
        return len(self._programs)

    @staticmethod
    def _moments(n_turns: int) -> tuple[float, ...]:
        n = n_turns
        s1 = n * (n + 1) / 2  # Σk for k = 1..n
        s2 = n * (n + 1) * (2 * n + 1) / 6  # Σk²
        sum_r = n * n - s1  # r = n - k
        sum_r2 = n * n * n - 2 * n * s1 + s2
        sum_kr = n * s1 - s2
        return (n, s1, sum_r, s2, sum_r2, sum_kr)

    def add(self, num_turns: int) -> None:
        if num_turns < 1:
            return
        if len(self._programs) == self._programs.maxlen:
            self._apply(self._programs[0], -1)
        self._programs.append(num_turns)
        self._apply(num_turns, +1)

    def _apply(self, num_turns: int, sign: int) -> None:
        for i, m in enumerate(self._moments(num_turns)):
            self._sums[i] += sign * m

    @property
    def eta(self) -> float:
        """1.0 until programs have been seen: the paper's cold-start assumption."""
        n, sk, sr, skk, srr, skr = self._sums
        if n < 2:
            return 1.0
        var_k = skk / n - (sk / n) ** 2
        var_r = srr / n - (sr / n) ** 2
        if var_k <= 1e-12 or var_r <= 1e-12:
            return 1.0 if var_k > 1e-12 or var_r > 1e-12 else 0.0
        cov = skr / n - (sk / n) * (sr / n)
        return -cov / math.sqrt(var_k * var_r)


class WorkloadModel:
    """The measured inputs of the TTL model, fed by the scheduler adapter."""

    def __init__(self, history_limit: int, queueing_window: int, program_window: int) -> None:
        self.tools = ToolStats(history_limit)  # tracks no call in flight until asked to
        self.queueing = SlidingMean(queueing_window)
        self.programs = Memoryfulness(program_window)
        self.contested = False  # a request could not get blocks within CONTENTION_WINDOW_S
        self._short_at = -math.inf

    def blocks_short(self, now: float) -> None:
        """An allocation failed for lack of blocks."""
        self._short_at = now
        self.contested = True

    def tick(self, now: float) -> None:
        """A step begins: contention lasts CONTENTION_WINDOW_S past the last failure."""
        self.contested = now - self._short_at <= CONTENTION_WINDOW_S

    def tool_called(self, tenant: Tenant, session: str, tool: str, now: float) -> None:
        self.tools.called(tenant, session, tool, now)

    def tool_returned(self, tenant: Tenant, session: str, tool: str, seconds: float) -> None:
        self.tools.returned(tenant, session, tool, seconds)

    @property
    def mean_queueing_delay_s(self) -> float:
        return self.queueing.mean

    @property
    def eta(self) -> float:
        return self.programs.eta
