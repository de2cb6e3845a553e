"""Every pin rule, in one class that knows nothing of vLLM.

The adapter (`vllm_continuum.adapter.scheduler_mixin`) forwards vLLM's
scheduler hooks here; `PinController` decides, over a `BlockLedger` and the
requests as vLLM gives them (only the attributes of `TurnRequest` are read).

- A pin is made in `on_finished` -> `_pin`: a finished turn of a session that
  called a tool keeps its block references for a TTL (`ttl.py`), within the
  session's quota and the pool's cap (`pin_budget.py`; the cap may release
  pins of later programs).
- A pin is released by `_release`, for one of `ReleaseReason`: its next turn
  was admitted (`after_step`), its TTL passed (`release_expired`, with one
  step of grace for a queued next turn), an allocation needed its blocks
  (`retry_with_pins_released`, as `pressure.py` allows, in the order
  latest-arriving program first), the cap made room, a pin past its
  contested TTL gave way to a waiting request (the learned TTL, `pin_cost:
  pressure|demand`),
  the session ended or aborted (`on_finished`), or a newer pin of the same
  context holds all its blocks.
- The waiting queue (`waiting_queue.py`) asks its `queue` (`queue_rules.py`)
  for lanes, keys and who is overdue; those rules read the pins and turns
  kept here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from vllm_continuum.core.hints import NO_HINTS, Hints, parse_hints
from vllm_continuum.core.ledger import BlockLedger
from vllm_continuum.core.pin_budget import cap_victims, session_quota_cut
from vllm_continuum.core.pin_table import Anchor, Pin, PinTable, ReleaseReason
from vllm_continuum.core.pin_value import PoolState, demand_exceeds_free, marginal_blocks
from vllm_continuum.core.pressure import may_release_pins, pins_to_release
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.queue_rules import QueueRules
from vllm_continuum.core.sessions import SessionRegistry, session_key
from vllm_continuum.core.ttl import NeverTTLPolicy, TTLPolicy, TurnEnd, make_ttl_policy
from vllm_continuum.core.turn import Turn, TurnRequest
from vllm_continuum.core.waiting_bound import WaitingBound
from vllm_continuum.core.workload import WorkloadModel

if TYPE_CHECKING:
    from vllm_continuum.config import ContinuumConfig

logger = logging.getLogger("vllm.continuum")

T = TypeVar("T")


class PinEvents(Protocol):
    """What the controller reports (`vllm_continuum.metrics.stats.ContinuumStats`
    counts it for `/metrics`)."""

    def on_pin(self, pin: Pin) -> None: ...
    def on_pin_refused(self, tool: str) -> None: ...
    def on_release(self, pin: Pin, reason: ReleaseReason, now: float) -> None: ...
    def on_resume(self, had_pin: bool, prompt_tokens: int, cached_tokens: int) -> None: ...
    def on_invalid_hints(self, count: int) -> None: ...
    def on_ttl_decision(self, tool: str, ttl_s: float, source: str) -> None: ...
    def on_tool_duration(self, tool: str, seconds: float) -> None: ...


@dataclass
class Ended:
    """A finished tool-call turn whose blocks have not been freed yet."""

    session: str
    tool: str
    hints: Hints
    program_arrival: float
    superseded: bool = False  # its next turn was allocated meanwhile: it holds the context


class PinController:
    def __init__(
        self,
        config: ContinuumConfig,
        ledger: BlockLedger,
        stats: PinEvents,
        *,
        block_size: int,
        hash_block_size: int,
        one_kv_group: bool = True,
        by_priority: bool = False,
        pinning: bool = True,
        clock: Callable[[], float] = time.monotonic,
        ttl_policy: Callable[[ContinuumConfig, WorkloadModel], TTLPolicy] = make_ttl_policy,
        waiting_of: Callable[[str], Iterable[TurnRequest]] = lambda session: (),
        on_lane_change: Callable[[str], None] = lambda session: None,
        pool_state: Callable[[Callable[[TurnRequest], bool]], PoolState | None] = lambda counted: None,
        preempted_status: object = "preempted",
        waiting_status: object = "waiting",
    ) -> None:
        """`preempted_status`, `waiting_status`: the request statuses (opaque
        here) of a preempted request and of one not yet admitted."""
        self.config = config
        self.ledger = ledger
        self.stats = stats
        self.clock = clock
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.hashes_per_block = max(1, block_size // hash_block_size)
        self.one_kv_group = one_kv_group  # else a pin cannot keep only its first blocks
        self.level: Callable[[TurnRequest], int] = (
            (lambda r: r.priority) if by_priority else (lambda r: 0)
        )
        self.workload = WorkloadModel(
            config.duration_history, config.queueing_window, config.program_window
        )
        self.ttl_policy = ttl_policy(config, self.workload)
        # Without prefix caching a pin could never be hit; a policy that never pins
        # takes no block at all (`never` with `queue_order: fcfs` is stock vLLM
        # exactly, the order blocks are freed in included).
        self.pinning = pinning and not isinstance(self.ttl_policy, NeverTTLPolicy)
        self.pins = PinTable()
        self.sessions = SessionRegistry(config.max_tracked_sessions)
        self.bound = WaitingBound(config.max_queue_delay_s)
        self.order = ProgramOrder(config.admission, config.program_precedence_s)
        self.turns: dict[str, Turn] = {}
        self._ended: dict[str, Ended] = {}  # request id -> its end, until its blocks are freed
        self.step = 0  # scheduling steps so far: an expired pin's grace is one of them
        self._step_time: float | None = None  # the clock as the step in progress began
        self._waiting_of = waiting_of  # queued requests that may be `session`'s
        self._on_lane_change = on_lane_change
        # The pool's free blocks and waiting demand, for `pin_cost: pressure`
        # (None: unknown, Eq. 2's cost). Read only when a pin is decided.
        self.pool_state = pool_state
        self._warned_hints: set[str] = set()
        # Where each waiting request goes in the queue, and who is overdue or entitled.
        self.queue = QueueRules(queue_order=config.queue_order, pins=self.pins, turns=self.turns,
                                order=self.order, bound=self.bound, level=self.level, now=self.now,
                                preempted_status=preempted_status, waiting_status=waiting_status)

    # ------------------------------------------------------------ step side
    def now(self) -> float:
        """The time every rule reads: within a scheduling step, the time the
        step began. vLLM peeks at the queue's head, works on it, then pops,
        assuming the head did not change: time passing inside the step (a slow
        connector lookup, a loaded CPU) must not reorder the queue or change
        what pins may do until the step ends."""
        return self._step_time if self._step_time is not None else self.clock()

    def begin_step(self) -> None:
        self._step_time = self.clock()
        self.step += 1
        self.release_expired(grace_until=self.step)

    def after_step(self, admitted: Iterable[tuple[TurnRequest, int]], oldest_waiting: float | None) -> None:
        """`admitted`: (request, cached tokens) of each request the step admitted;
        `oldest_waiting`: when the oldest request still waiting was enqueued."""
        for request, num_cached_tokens in admitted:
            self._on_admitted(request, num_cached_tokens)
        self.bound.prune(oldest_waiting if oldest_waiting is not None else self.now())

    def end_step(self) -> None:
        """The step is over: rules read the clock again."""
        self._step_time = None

    # --------------------------------------------------------- arrival side
    def on_arrival(self, request: TurnRequest, extra_args: Mapping[str, object] | None) -> None:
        """A new request: read its hints, and whether it continues its session."""
        self._end_idle_programs()
        hints = parse_hints(extra_args, self.config.max_hint_tool_name_length)
        if hints.invalid:
            self._count_invalid_hints(request.request_id, hints, extra_args)
        now = self.now()
        turn = Turn(hints, enqueued_at=now, program_arrival=request.arrival_time)
        self.turns[request.request_id] = turn
        session = turn.session = session_key(request.session_id)
        if session is None:
            return
        arrival = self.sessions.observe_arrival(
            session, request.arrival_time, now, request.block_hashes
        )
        turn.continues, turn.first_turn = arrival.continues, arrival.first_turn
        measured = arrival.measured
        pin = self.pins.continued_by(session, request.block_hashes)
        # The session table is bounded and forgets idle programs; a live pin
        # is the truth about its program whatever the table says.
        if pin is not None and not arrival.continues:
            self.sessions.adopt(session, pin.session_arrival, pin.anchor)
            turn.continues, turn.first_turn = True, False
            measured = (pin.tool, max(0.0, now - pin.created_at))
        elif pin is None and self.pins.of_session(session):
            turn.first_turn = False  # the program lives on in its pins: a stranger
        if measured is not None:
            tool, seconds = measured
            self.workload.durations.add(tool, seconds)
            self.stats.on_tool_duration(tool, seconds)
        if turn.continues:
            turn.program_arrival = self.sessions.first_arrival(session, request.arrival_time)
            turn.resuming = (pin is not None, now)

    def _end_idle_programs(self) -> None:
        horizon = self.config.program_idle_horizon_s
        busy = lambda session: bool(self.pins.of_session(session))  # noqa: E731  (a tool runs)
        for _, turns in self.sessions.pop_idle(self.now(), horizon, busy):
            self.workload.programs.add(turns)

    def _on_admitted(self, request: TurnRequest, num_cached_tokens: int) -> None:
        turn = self.turns.get(request.request_id)
        if turn is not None:
            self.bound.went_ahead(turn.enqueued_at, self.level(request), self.now())
            if turn.resuming is not None:
                had_pin, arrived = turn.resuming
                turn.resuming = None
                if not had_pin:  # T: what turns that lost their cache waited
                    self.workload.queueing.add(self.now() - arrived)
                self.stats.on_resume(had_pin, request.num_prompt_tokens, num_cached_tokens)
        self._hand_over(request)  # if its allocation did not already

    # ---------------------------------------------------------- finish side
    def on_finished(
        self, request: TurnRequest, aborted: bool, tool_called: Callable[[], str | None]
    ) -> bool:
        """A finished request whose blocks are freed at once: `on_turn_end`
        then `on_blocks_freed`. True if a pin now holds its blocks."""
        self.on_turn_end(request, aborted, tool_called)
        return self.on_blocks_freed(request, aborted, tool_called)

    def on_turn_end(
        self, request: TurnRequest, aborted: bool, tool_called: Callable[[], str | None]
    ) -> None:
        """A request finished: its turn ends now (the tool starts), even if a KV
        connector keeps its blocks a while longer (it sends them first).
        `tool_called` reads the tool from its output."""
        turn = self.turns.pop(request.request_id, None)
        session = session_key(request.session_id)
        if session is None:
            return
        hints = turn.hints if turn is not None else NO_HINTS
        # Only the program's own turns (its first, or one continuing its last)
        # speak for the session; a request that merely carries the id does not.
        of_program = turn is None or turn.continues or turn.first_turn
        hashes = request.block_hashes
        # A stop string also ends a turn as an abort (the front end aborts
        # it), so an abort with output is judged by that output.
        tool = None
        if request.num_output_tokens:
            tool = hints.tool or tool_called()
            if of_program:
                anchor = Anchor.of_prompt(hashes, request.num_prompt_tokens // self.hash_block_size)
                self.sessions.observe_turn_end(session, self.now(), tool, anchor)
        if hints.last_turn:
            # Only the pins whose context it continues: a request that merely
            # carries the id (guessed, or the table forgot the session) must
            # not free another program's pins; a fork's other branches expire.
            for pin in self.pins.all_continued_by(session, hashes):
                self._release(pin, ReleaseReason.LAST_TURN)
            if of_program:
                self.workload.programs.add(self.sessions.end_program(session))
            return
        if tool is None:
            if aborted:
                self._release_continued(session, hashes, ReleaseReason.ABORTED)
            return
        if self.pinning:
            program_arrival = turn.program_arrival if turn is not None else request.arrival_time
            self._ended[request.request_id] = Ended(session, tool, hints, program_arrival)

    def on_blocks_freed(
        self, request: TurnRequest, aborted: bool, tool_called: Callable[[], str | None]
    ) -> bool:
        """A finished request's blocks are being freed: True if a pin now holds
        them (the adapter must not free them)."""
        if request.request_id in self.turns:  # freed without its end reported first
            self.on_turn_end(request, aborted, tool_called)
        ended = self._ended.pop(request.request_id, None)
        if ended is None or ended.superseded:
            # Freed late (a connector sent the blocks first) after the next turn
            # was allocated: it holds the context already; a pin would only expire.
            return False
        return self._pin(request, ended.session, ended.tool, ended.hints, ended.program_arrival)

    def on_allocated(self, request: TurnRequest) -> None:
        """vLLM allocated blocks for a waiting request: its prefix hit is touched,
        so a pin of the context it continues is handed over now, whether vLLM
        schedules it this step or holds it while a connector loads its KV."""
        turn = self.turns.get(request.request_id)
        if turn is not None and turn.continues:
            for ended in self._ended.values():  # turns whose blocks a connector still holds
                ended.superseded |= ended.session == turn.session
        self._hand_over(request)

    def _hand_over(self, request: TurnRequest) -> None:
        pin = self.pins.continued_by(session_key(request.session_id), request.block_hashes)
        if pin is not None and pin.request_id != request.request_id:
            self._release(pin, ReleaseReason.RESUMED)

    def _pin(
        self, request: TurnRequest, session: str, tool: str, hints: Hints, arrival: float
    ) -> bool:
        blocks, fence = self.ledger.take(request)
        hashes = tuple(request.block_hashes)
        replaced, kept = session_quota_cut(
            self.pins, session, self.ledger.ids(blocks, keep_null=True), hashes,
            quota=int(self.config.max_session_pinned_fraction * self.ledger.pool_size),
            hashes_per_block=self.hashes_per_block, one_kv_group=self.one_kv_group)
        kept_ids = self.ledger.ids(blocks[:kept])
        kept_hashes = hashes[: kept * self.hashes_per_block]
        anchor = Anchor.of_prompt(kept_hashes, request.num_prompt_tokens // self.hash_block_size)
        ttl_s = 0.0
        contested_ttl_s = None
        if kept_ids and anchor is not None:
            # The TTL is decided on what the pin will actually keep.
            kept_tokens = min(request.num_tokens, kept * self.block_size)
            turn = TurnEnd(session, tool, kept_tokens, hinted_ttl_s=hints.ttl_s)
            if self.config.pin_cost == "pressure":
                # Counting the pin's own blocks is O(blocks): only where it is read.
                pool = self.pool_state(self.queue.entitled)
                own = (marginal_blocks(kept_ids, self.ledger.ref_count)
                       if demand_exceeds_free(pool) else 0)
                turn = replace(turn, pool=pool, marginal_blocks=own)
            decision = self.ttl_policy.decide(turn)
            ttl_s, contested_ttl_s = decision.ttl_s, decision.contested_ttl_s
            self.stats.on_ttl_decision(tool, ttl_s, decision.source)
            logger.debug(
                "continuum: session=%s tool=%s ttl=%.3fs source=%s",
                session, tool, ttl_s, decision.source,
            )
        cap = int(self.config.max_pinned_fraction * self.ledger.pool_size)
        victims = cap_victims(self.pins, kept_ids, replaced, arrival, cap=cap) if ttl_s > 0 else None
        if victims is None:
            if ttl_s > 0:
                self.stats.on_pin_refused(tool)
            self.ledger.give_back(blocks, fence)
            return False
        self.ledger.give_back(blocks[kept:], fence)
        for old in replaced:
            self._release(old, ReleaseReason.REPLACED)
        for victim in victims:
            self._release(victim, ReleaseReason.PRESSURE)
        now = self.now()
        pin = Pin(
            session_id=session,
            request_id=request.request_id,
            tool=tool,
            blocks=blocks[:kept],
            block_ids=kept_ids,
            created_at=now,
            expires_at=now + ttl_s,
            session_arrival=arrival,
            anchor=anchor,
            hashes=kept_hashes,
            fence=fence,
            contested_at=now + contested_ttl_s if contested_ttl_s is not None else float("inf"),
        )
        self.pins.add(pin)
        self.stats.on_pin(pin)
        self._on_lane_change(session)
        return True

    # -------------------------------------------------------- release side
    def release_all(self, reason: ReleaseReason) -> None:
        for pin in self.pins:
            self._release(pin, reason)

    def _release(self, pin: Pin, reason: ReleaseReason) -> None:
        if not self.pins.remove(pin):
            return
        self.ledger.give_back(pin.blocks, pin.fence)
        self.stats.on_release(pin, reason, self.now())
        self._on_lane_change(pin.session_id)

    def _release_continued(self, session: str, hashes: Sequence[Hashable], reason: ReleaseReason) -> None:
        pin = self.pins.continued_by(session, hashes)
        if pin is not None:
            self._release(pin, reason)

    def release_expired(self, grace_until: int) -> None:
        """The TTL is a hard bound, but for one scheduling step of grace when
        the pinned context's next turn is already queued (it is being admitted)."""
        if not self.pins:
            return
        for pin in self.pins.expired(self.now()):
            if pin.grace_step is None and self._next_turn_waiting(pin):
                pin.grace_step = grace_until
            if pin.grace_step is not None and self.step <= pin.grace_step:
                self.pins.requeue(pin)
            else:
                self._release(pin, ReleaseReason.EXPIRED)

    def _next_turn_waiting(self, pin: Pin) -> bool:
        return pin.anchor is not None and any(
            session_key(r.session_id) == pin.session_id and pin.anchor.continued_by(r.block_hashes)
            for r in self._waiting_of(pin.session_id)
        )

    def retry_with_pins_released(
        self,
        request: TurnRequest,
        retry: Callable[[], T | None],
        *,
        shortfall: int | None,
        keep: frozenset[int],
        running: bool,
        preempted: bool,
        waiting: bool,
        anything_running: bool,
    ) -> T | None:
        """After an allocation for `request` failed: release the fewest pins
        that cover its `shortfall` of blocks (None: unknown) and `retry` once,
        if the pressure policy allows. If no set of pins covers it, or the
        retry fails anyway, nothing is released."""
        candidates = [p for p in self.pins.release_order() if self.ledger.can_give_back_now(p.fence)]
        victims = pins_to_release(candidates, shortfall, self.ledger.ref_count, keep=keep)
        if not victims:
            return None
        if not may_release_pins(
            self.config.pressure_policy,
            running,
            anything_running=anything_running,
            preempted=preempted,
            overdue=waiting and self.queue.overdue(request),
        ):
            # Only pins past their contested TTL give way (to a request entitled
            # to pinned memory), and pins of a program that lost its precedence;
            # if they do not cover it, pins could make room but are kept:
            # everyone waiting waits.
            now = self.now()
            entitled = self.queue.entitled(request)
            takeable = [p for p in candidates
                        if (entitled and p.contested_at <= now)
                        or self.order.lost_precedence(p.session_arrival, now)]
            victims = pins_to_release(takeable, shortfall, self.ledger.ref_count, keep=keep)
            if not victims:
                self.bound.held_by_pins(self.level(request), now)
                return None
        for pin in victims:
            self.pins.remove(pin)
            self.ledger.give_back(pin.blocks, pin.fence)
        allocated = retry()
        if allocated is None:  # the estimate was wrong: restore, nothing was taken
            logger.debug("continuum: %d pins did not cover the shortfall of %s; kept",
                         len(victims), request.request_id)
            for pin in victims:
                self.ledger.take_back(pin.blocks)
                self.pins.add(pin)
            return None
        now = self.now()
        for pin in victims:
            self.stats.on_release(pin, ReleaseReason.PRESSURE, now)
            self._on_lane_change(pin.session_id)
        return allocated

    # ------------------------------------------------------------ utilities
    def held(self, session: str) -> bool:
        """Whether one of the session's pins is past its TTL, kept for its queued turn."""
        return any(p.grace_step is not None for p in self.pins.of_session(session))

    def _count_invalid_hints(self, request_id: str, hints: Hints, extra) -> None:
        self.stats.on_invalid_hints(len(hints.invalid))
        for key in hints.invalid:
            value = repr(extra.get(key))[:80]
            if key not in self._warned_hints:
                self._warned_hints.add(key)
                logger.warning(
                    "continuum: ignoring invalid hint %s=%s on request %s (further "
                    "invalid %s hints are only counted)", key, value, request_id, key,
                )
            else:
                logger.debug("continuum: ignoring invalid hint %s=%s", key, value)
