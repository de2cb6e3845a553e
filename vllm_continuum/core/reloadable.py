"""Which pins give way like under `yield` because a host tier would serve them back.

Under `hold`, pins are kept while other work runs: a lost pin's next turn
would prefill its whole context again, so keeping it is worth a waiting
request's delay (the paper's Algorithm 1). With vLLM's KV offload to host
memory that is no longer true of every pin: a pin whose context the host
tier holds costs a reload if lost (lost_pin.py), 30-50x less than a prefill,
and keeping it makes the requests behind it wait for nothing. Such a pin is
*reloadable*, and gives way to a waiting request as every pin does under
`yield`, when both hold:

- its price: what losing it costs (a reload of what the tier held when it was
  made, a prefill of the rest, the outputs that `offload_prompt_only` never
  stores) is at most `RELOAD_SHARE` of its prefill;
- the tier serves lost pins back: of the last `WINDOW` turns that resumed a
  context without a pin (it expired, gave way, or was never made), the
  tokens found cached (host tier or GPU prefix cache) are at least
  `SERVED_SHARE` of their prompts. A host tier too small for the traffic
  evicts a context before its next turn comes (tool time plus the queue's
  wait); measured, not modelled, so that a 1x tier under overload keeps its
  pins (`hold` measured 3.03x over stock + offload there, `yield` 1.97x)
  and a 3x one lets them go (docs/benchmarks.md, issue 47).

Without a host tier no pin is reloadable: `hold` is exactly the paper's.
"""

from __future__ import annotations

from collections import deque

from vllm_continuum.core.lost_pin import Held, lost_pin_s
from vllm_continuum.core.prefill_profile import PrefillProfile

RELOAD_SHARE = 0.25  # a reload cheaper than a quarter of the prefill it replaces
SERVED_SHARE = 0.8  # of lost pins' prompts, found cached when their next turn came
WINDOW = 64  # resumes without a pin the share is measured over
MIN_SAMPLES = 16  # until then, the tier is not trusted (every pin is kept)


class Reloadable:
    def __init__(self, profile: PrefillProfile, *, window: int = WINDOW) -> None:
        self.profile = profile
        self._resumes: deque[tuple[int, int]] = deque(maxlen=window)  # (prompt, cached) tokens
        self._prompt = self._cached = 0  # sums over the window

    def priced(self, context_tokens: int, held: Held) -> bool:
        """Whether losing a pin of this context costs at most RELOAD_SHARE of its prefill."""
        if held.tokens <= 0:
            return False
        full = self.profile.seconds(context_tokens)
        return lost_pin_s(self.profile, context_tokens, held) <= RELOAD_SHARE * full

    def resumed_without_pin(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A turn that continued its program without a pin was admitted."""
        if prompt_tokens <= 0:
            return
        if len(self._resumes) == self._resumes.maxlen:
            old_prompt, old_cached = self._resumes[0]
            self._prompt -= old_prompt
            self._cached -= old_cached
        cached = min(cached_tokens, prompt_tokens)
        self._resumes.append((prompt_tokens, cached))
        self._prompt += prompt_tokens
        self._cached += cached

    @property
    def served_share(self) -> float:
        return self._cached / self._prompt if self._prompt else 0.0

    @property
    def tier_serves(self) -> bool:
        """Whether lost pins' contexts have been coming back from the cache."""
        return len(self._resumes) >= MIN_SAMPLES and self.served_share >= SERVED_SHARE
