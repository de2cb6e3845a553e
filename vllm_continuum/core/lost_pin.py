"""What losing a pin costs its session's next turn, by the tier that would serve it.

Without a host tier, a lost pin's next turn prefills its whole context again:
`PrefillProfile.seconds(n)`. With vLLM's KV offload to host memory
(`--kv-offloading-size`), every prompt block is copied to the host as it is
computed, so a lost pin's next turn loads what the host tier still holds
and prefills only the rest: the output tokens (vLLM's `offload_prompt_only`,
on by default, never stores them) and whatever the host's LRU evicted.
So the price of a context of n tokens, h of them held by the host tier, is

    reload_s(h) + t(n) - t(h)

(t the prefill profile: the tokens past h computed on top of h cached),
30-50x less than t(n) for a long context held whole (Llama-3.1-8B on an
H100 over PCIe 5: 70k tokens reload in about 0.18 s, prefill in 5.4 s).

The host tier is the adapter's (`adapter/host_tier.py`, reading the KV
connector); here it is what the pin rules may ask of it (`HostTier`). What
it holds is looked up when a pin is made and again when its TTL is revisited:
the host's LRU may evict a long pin's copy meanwhile.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple, Protocol

from vllm_continuum.core.prefill_profile import PrefillProfile


class HostTier(Protocol):
    """A host tier of the KV cache, as the pin rules see it."""

    def held_tokens(self, hashes: Sequence[Hashable], num_tokens: int) -> int:
        """Of a context of `num_tokens` whose blocks have these hashes, the
        leading tokens the tier holds (or is storing)."""

    def reload_s(self, num_tokens: int) -> float:
        """Seconds to load that many tokens' KV from the tier."""

    def loaded_tokens(self, request_id: str) -> int:
        """Tokens the request was allocated to load from the tier (0 if none);
        asked once, when the request is admitted."""

    def keep(self, hashes: Sequence[Hashable]) -> None:
        """A context's GPU copy becomes evictable: make what the tier holds of
        it the last the tier evicts (most recently used)."""


class Held(NamedTuple):
    """What the host tier holds of a context: its leading tokens, their reload time."""

    tokens: int = 0
    reload_s: float = 0.0


NOTHING_HELD = Held()


class KeepingHostCopies:
    """Release events passed on to `events`; a pin that expired or gave way
    under pressure first has its context kept by the host tier (`keep`): its
    GPU blocks go back to vLLM's LRU, and its next turn, if it comes, finds it
    there. (A pin that was resumed, or whose program ended, needs no copy.)"""

    KEPT = frozenset({"expired", "pressure"})

    def __init__(self, events, tier: HostTier) -> None:
        self.events, self.tier = events, tier

    def on_release(self, pin, reason, now: float) -> None:
        if reason.value in self.KEPT:
            self.tier.keep(pin.hashes)
        self.events.on_release(pin, reason, now)


def held_by(tier: HostTier | None, hashes: Sequence[Hashable], num_tokens: int) -> Held:
    """What `tier` holds of a context (nothing without a tier)."""
    if tier is None or num_tokens <= 0:
        return NOTHING_HELD
    tokens = min(num_tokens, max(0, tier.held_tokens(hashes, num_tokens)))
    return Held(tokens, tier.reload_s(tokens)) if tokens else NOTHING_HELD


def lost_pin_s(profile: PrefillProfile, num_context_tokens: int, held: Held = NOTHING_HELD) -> float:
    """What the next turn pays if the pin of its context is lost: a reload of
    what the host tier holds, a prefill of the rest on top of it."""
    if held.tokens <= 0:
        return profile.seconds(num_context_tokens)
    rest = max(0.0, profile.seconds(num_context_tokens) - profile.seconds(held.tokens))
    return held.reload_s + rest


RESUME_SOURCES = ("pinned", "gpu_cache", "host_tier", "recomputed")


def resume_source(had_pin: bool, loaded_tokens: int, cached_tokens: int) -> str:
    """Where a resumed turn's context came from: its pin; else the host tier,
    if it loaded any of it; else vLLM's GPU prefix cache, if it found any of
    it there; else nowhere (`recomputed`)."""
    if had_pin:
        return "pinned"
    if loaded_tokens > 0:
        return "host_tier"
    return "gpu_cache" if cached_tokens > 0 else "recomputed"
