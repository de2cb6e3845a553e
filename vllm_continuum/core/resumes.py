"""A turn continued its program: what the rules learn as it is admitted, or
as it takes its context's pin over.

- `T`, what turns that lost their cache waited in the queue
  (`WorkloadModel.queueing`, read by the TTL rules);
- the host tier's evidence (reloadable.py): of a lost pin's next turn, the
  share of its prompt the cache served; of a hand-over, the share of the
  pin's context the tier still held (what the turn would have loaded had
  the pin been lost);
- `/metrics`: resumes by where their prefix came from (`resume_source`).

Each is O(1) but the hand-over's host lookup (`held_now`: the same connector
lookup as at a pin's creation), made only while the tenant's hand-overs can
still count. Nothing here changes what vLLM reads within a step: a pin's
`reloadable` flag is fixed when the pin is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from vllm_continuum.core.lost_pin import Held, HostTier, resume_source
from vllm_continuum.core.pin_table import Pin
from vllm_continuum.core.reloadable import Reloadable
from vllm_continuum.core.turn import Turn, TurnRequest
from vllm_continuum.core.workload import WorkloadModel


class ResumeEvents(Protocol):
    def on_resume(self, had_pin: bool, prompt_tokens: int, cached_tokens: int,
                  source: str = "") -> None: ...


class Resumes:
    def __init__(self, workload: WorkloadModel, stats: ResumeEvents, *,
                 host_tier: HostTier | None, reloadable: Reloadable | None,
                 held_now: Callable[[Pin], Held]) -> None:
        self.workload, self.stats = workload, stats
        self.host_tier, self.reloadable, self.held_now = host_tier, reloadable, held_now

    def admitted(self, request: TurnRequest, turn: Turn, cached_tokens: int, now: float) -> None:
        """vLLM admitted `turn` with `cached_tokens` of its prompt cached: if it
        continues its program, its resume counts (once)."""
        if turn.resuming is None:
            return
        had_pin, arrived = turn.resuming
        turn.resuming = None
        prompt = request.num_prompt_tokens
        if not had_pin:
            self.workload.queueing.add(now - arrived)
            if self.reloadable is not None:
                self.reloadable.resumed(turn.program.tenant, prompt, cached_tokens)
        loaded = self.host_tier.loaded_tokens(request.request_id) if self.host_tier else 0
        self.stats.on_resume(had_pin, prompt, cached_tokens,
                             resume_source(had_pin, loaded, cached_tokens))

    def handed_over(self, pin: Pin, request: TurnRequest) -> None:
        """`request`, the pin's context's next turn, takes it over."""
        program, rule = pin.program, self.reloadable
        if program is not None and rule is not None and rule.reads_hand_overs(program.tenant):
            rule.resumed(program.tenant, request.num_prompt_tokens,
                         self.held_now(pin).tokens, pinned=True)
