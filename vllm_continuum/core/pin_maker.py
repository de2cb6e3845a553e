"""What a finished tool-call turn keeps pinned: how much, for how long, and
whom it displaces. The one place a pin enters the table.

- How much: the session's quota (`pin_budget.session_quota_cut`) keeps the
  pin to its first blocks if it must (its next turn hits them: prefix hashes
  chain from the start), and the session's pins whose context it holds are
  replaced.
- How long: the TTL policy (`ttl.py`) decides on what the pin will actually
  keep, and on what losing it would cost: with a host tier, what the tier
  holds of it is reloaded, not prefilled (`lost_pin.py`); under `pin_cost:
  pressure` it also reads the pool's state and the blocks the pin alone
  would hold.
- Whom: the pool's cap (`pin_budget.cap_victims`) may release pins of
  programs that arrived later; if that cannot make room, or the TTL is 0,
  nothing is pinned and the blocks go back as stock vLLM frees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from vllm_continuum.core.hints import Hints
from vllm_continuum.core.ledger import BlockLedger, hashes_per_block
from vllm_continuum.core.lost_pin import NOTHING_HELD, Held, HostTier, held_by
from vllm_continuum.core.pin_budget import cap_victims, session_quota_cut
from vllm_continuum.core.pin_release import PinReleaser
from vllm_continuum.core.pin_table import Anchor, Pin, PinTable, ReleaseReason
from vllm_continuum.core.pin_value import PoolState, demand_exceeds_free, marginal_blocks
from vllm_continuum.core.programs import Program
from vllm_continuum.core.queue_rules import QueueRules
from vllm_continuum.core.reloadable import Reloadable
from vllm_continuum.core.ttl import TTLPolicy, TurnEnd
from vllm_continuum.core.turn import TurnRequest

if TYPE_CHECKING:
    from vllm_continuum.config import ContinuumConfig

logger = logging.getLogger("vllm.continuum")


class PinMakerEvents(Protocol):
    def on_pin(self, pin: Pin) -> None: ...
    def on_pin_refused(self, tool: str) -> None: ...
    def on_ttl_decision(self, tool: str, ttl_s: float, source: str) -> None: ...


class PinMaker:
    def __init__(
        self,
        config: ContinuumConfig,
        ttl_policy: TTLPolicy,
        pins: PinTable,
        ledger: BlockLedger,
        releaser: PinReleaser,
        queue: QueueRules,
        stats: PinMakerEvents,
        *,
        block_size: int,
        hash_block_size: int,
        one_kv_group: bool,
        pool_state: Callable[[Callable[[TurnRequest], bool]], PoolState | None],
        now: Callable[[], float],
        host_tier: HostTier | None = None,
        reloadable: Reloadable | None = None,
    ) -> None:
        """`one_kv_group`: else a pin cannot keep only its first blocks;
        `pool_state(counted)`: the pool's free blocks and the demand of the
        waiting requests `counted` says are a pin's cost (None: unknown); `now`:
        the controller's clock; `host_tier`: vLLM's KV offload, if on;
        `reloadable`: which pins the host tier would serve back (reloadable.py)."""
        self.config, self.ttl_policy = config, ttl_policy
        self.pins, self.ledger, self.releaser, self.queue, self.stats = pins, ledger, releaser, queue, stats
        self.block_size, self.hash_block_size = block_size, hash_block_size
        self.hashes_per_block = hashes_per_block(block_size, hash_block_size)
        self.one_kv_group = one_kv_group
        self.pool_state, self.now = pool_state, now
        self.host_tier, self.reloadable = host_tier, reloadable

    def pin(self, request: TurnRequest, session: str, tool: str, hints: Hints,
            program: Program) -> Pin | None:
        """Pin what the finished `request` (a turn of `session`'s `program` that
        called `tool`) may keep: the pin, if one now holds its blocks (then
        they must not be freed)."""
        arrival = program.arrival
        blocks, fence = self.ledger.take(request)
        hashes = tuple(request.block_hashes)
        pool_size = self.ledger.pool_size
        ids = self.ledger.ids(blocks, keep_null=True)  # None for a null block
        replaced, kept = session_quota_cut(
            self.pins, session, ids, hashes,
            quota=int(self.config.max_session_pinned_fraction * pool_size),
            hashes_per_block=self.hashes_per_block, one_kv_group=self.one_kv_group,
            pool_size=pool_size)
        kept_ids = (ids if kept == len(ids) and None not in ids
                    else tuple(i for i in ids[:kept] if i is not None))
        kept_hashes = hashes[: kept * self.hashes_per_block]
        anchor = Anchor.of_prompt(kept_hashes, request.num_prompt_tokens // self.hash_block_size)
        ttl_s = 0.0
        contested_ttl_s = None
        revisable = False
        kept_tokens = 0
        held = NOTHING_HELD
        if kept_ids and anchor is not None:
            # The TTL is decided on what the pin will actually keep.
            kept_tokens = min(request.num_tokens, kept * self.block_size)
            held = held_by(self.host_tier, kept_hashes, kept_tokens)
            ttl_s, contested_ttl_s, revisable = self._ttl(
                TurnEnd(session, tool, kept_tokens, hinted_ttl_s=hints.ttl_s, tenant=program.tenant,
                        held=held),
                kept_ids)
        cap = int(self.config.max_pinned_fraction * pool_size)
        victims = cap_victims(self.pins, kept_ids, replaced, arrival, cap=cap) if ttl_s > 0 else None
        if victims is None:
            if ttl_s > 0:
                self.stats.on_pin_refused(tool)
            self.ledger.give_back(blocks, fence)
            return None
        self.ledger.give_back(blocks[kept:], fence)
        for old in replaced:
            self.releaser.release(old, ReleaseReason.REPLACED)
        for victim in victims:
            self.releaser.release(victim, ReleaseReason.PRESSURE)
        now = self.now()
        pin = Pin(
            session_id=session,
            request_id=request.request_id,
            tool=tool,
            blocks=blocks[:kept],
            block_ids=kept_ids,
            created_at=now,
            expires_at=now + ttl_s,
            program_arrival=arrival,
            anchor=anchor,
            hashes=kept_hashes,
            fence=fence,
            contested_at=now + contested_ttl_s if contested_ttl_s is not None else float("inf"),
            revisable=revisable,
            context_tokens=kept_tokens,
            program=program,
            held=held,
            reloadable=self.reloadable is not None and self.reloadable.gives_way(program.tenant, kept_tokens, held),
        )
        self.pins.add(pin)
        self.stats.on_pin(pin)
        return pin

    def held_now(self, pin: Pin) -> Held:
        """What the host tier holds of the pin's context now (its LRU may have
        evicted part of it since the pin was made)."""
        return held_by(self.host_tier, pin.hashes, pin.context_tokens)

    def _ttl(self, turn: TurnEnd, kept_ids: tuple[int, ...]) -> tuple[float, float | None, bool]:
        """(TTL, contested TTL, revisable) of a pin of `kept_ids`, as the policy decides."""
        if self.ttl_policy.reads_pool and turn.hinted_ttl_s is None:
            # Contention counts the waiting requests entitled to pinned memory;
            # counting the pin's own blocks is O(blocks): only where it is read.
            pool = self.pool_state(self.queue.entitled)
            own = marginal_blocks(kept_ids, self.ledger.ref_count) if demand_exceeds_free(pool) else 0
            turn = replace(turn, pool=pool, marginal_blocks=own)
        decision = self.ttl_policy.decide(turn)
        self.stats.on_ttl_decision(turn.tool, decision.ttl_s, decision.source)
        if logger.isEnabledFor(logging.DEBUG):  # (a pin is made at every tool call)
            logger.debug("continuum: session=%s tool=%s ttl=%.3fs source=%s",
                         turn.session_id, turn.tool, decision.ttl_s, decision.source)
        return decision.ttl_s, decision.contested_ttl_s, decision.revisable
