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
  `SERVED_SHARE` of their prompts. Until `MIN_SAMPLES` such turns have
  come, the tier is judged by the pins handed to their next turns: what it
  still held of each context then, what that turn would have loaded had
  the pin been lost. (Lost pins are rare where pins are seldom needed, below
  overload, where holding them made later programs wait for contexts the
  tier held anyway; but a hand-over does not see the queue a lost pin's next
  turn waits in, so lost pins' own resumes, once enough, have the last
  word.) A host tier too small for the traffic evicts a context before its
  next turn comes (tool time plus the queue's wait); measured, not
  modelled, so that a 1x tier under overload keeps its pins (`hold`
  measured 3.03x over stock + offload there, `yield` 1.97x) and a 3x one
  lets them go (docs/benchmarks.md, issue 47).

The share is kept per tenant (a request's `cache_salt`, tool_stats.py),
and a pin is judged when it is made, by its own tenant's share: one
client's turns cannot make another tenant's pins give way. Bounded as the
tool statistics are: the unsalted tenant and the `MAX_TENANTS` salted ones
most recently heard from; a forgotten tenant has no evidence, so its pins
are kept (a flood of salts can only make pins be held, as the paper's
`hold` holds them).

Without a host tier no pin is reloadable: `hold` is exactly the paper's.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm_continuum.core.lost_pin import Held, lost_pin_s
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.tool_stats import MAX_TENANTS, Tenant, salted_entry
from vllm_continuum.core.workload import SlidingMean

RELOAD_SHARE = 0.25  # a reload cheaper than a quarter of the prefill it replaces
SERVED_SHARE = 0.8  # of lost pins' prompts, found cached when their next turn came
WINDOW = 64  # resumes without a pin the share is measured over
MIN_SAMPLES = 16  # until then, the tier is not trusted (every pin is kept)


class Share:
    """The last `window` resumes of one kind: the share of their prompt
    tokens the cache served, or would have (the same window of both sums)."""

    __slots__ = ("_prompt", "_cached")

    def __init__(self, window: int) -> None:
        self._prompt, self._cached = SlidingMean(window), SlidingMean(window)

    def add(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prompt.add(prompt_tokens)
        self._cached.add(min(cached_tokens, prompt_tokens))

    @property
    def share(self) -> float:
        prompt = self._prompt.mean
        return self._cached.mean / prompt if prompt else 0.0

    @property
    def judged(self) -> bool:
        return len(self._prompt) >= MIN_SAMPLES


class ServedShare:
    """One tenant's evidence: its lost pins' resumes, and its pins' hand-overs."""

    __slots__ = ("lost", "kept")

    def __init__(self, window: int) -> None:
        self.lost, self.kept = Share(window), Share(window)

    @property
    def trusted(self) -> bool:
        """Whether lost pins' contexts have been coming back from the cache.
        Lost pins' own resumes, when there are enough of them, have the last
        word: a hand-over does not see the queue a lost pin's turn waits in."""
        if self.lost.judged:
            return self.lost.share >= SERVED_SHARE
        return self.kept.judged and self.kept.share >= SERVED_SHARE


class Reloadable:
    def __init__(self, profile: PrefillProfile, *, window: int = WINDOW,
                 max_tenants: int = MAX_TENANTS) -> None:
        self.profile, self.window, self.max_tenants = profile, window, max_tenants
        self._unsalted = ServedShare(window)
        self._salted: OrderedDict[str, ServedShare] = OrderedDict()

    def priced(self, context_tokens: int, held: Held) -> bool:
        """Whether losing a pin of this context costs at most RELOAD_SHARE of its prefill."""
        if held.tokens <= 0:
            return False
        full = self.profile.seconds(context_tokens)
        return lost_pin_s(self.profile, context_tokens, held) <= RELOAD_SHARE * full

    def gives_way(self, tenant: Tenant, context_tokens: int, held: Held) -> bool:
        """A pin of `tenant`'s being made: whether it is reloadable."""
        served = self.served(tenant)
        return served is not None and served.trusted and self.priced(context_tokens, held)

    def served(self, tenant: Tenant) -> ServedShare | None:
        """The tenant's share, if it has one. O(1); reads change nothing."""
        return self._unsalted if tenant is None else self._salted.get(tenant)

    def reads_hand_overs(self, tenant: Tenant) -> bool:
        """Whether a hand-over of `tenant`'s can still count: not once its lost
        pins are judged (they keep the last word, and their window stays full),
        so the host lookup a hand-over's sample needs is not made for nothing."""
        served = self.served(tenant)
        return served is None or not served.lost.judged

    def resumed(self, tenant: Tenant, prompt_tokens: int, cached_tokens: int, pinned: bool = False) -> None:
        """A turn of `tenant` continued its program: `cached_tokens` of its
        prompt were found cached (no pin), or (`pinned`) held by the host tier
        as its pin was handed over."""
        if prompt_tokens <= 0:
            return
        served = (self._unsalted if tenant is None else
                  salted_entry(self._salted, tenant, self.max_tenants, lambda: ServedShare(self.window)))
        (served.kept if pinned else served.lost).add(prompt_tokens, cached_tokens)
