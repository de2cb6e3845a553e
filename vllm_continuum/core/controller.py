"""Every pin rule, behind vLLM's scheduler hooks, in classes that know nothing
of vLLM.

The adapter (`vllm_continuum.adapter.scheduler_mixin`) forwards vLLM's
hooks here; `PinController` keeps what it learns of each request and
program (`Turn`, `ProgramTable`, the workload model) over a
`BlockLedger` and the requests as vLLM gives them (only the attributes of
`TurnRequest` are read), and hands the pins to two modules:

- `pin_maker.py`: a finished turn of a session that called a tool keeps
  its blocks (`on_blocks_freed`), for a TTL (`ttl.py`), within the
  session's quota and the pool's cap (`pin_budget.py`);
- `pin_release.py`: a pin goes for one of `ReleaseReason`: its next turn
  was allocated (`on_allocated`, `after_step`), its TTL passed (each step
  and each arrival, with one step of grace for a queued next turn), an
  allocation needed its blocks (`retry_with_pins_released`, as
  `pressure.py` allows), the cap or a newer pin of the same context took
  its place, a pin past its contested TTL gave way (the learned TTL), or
  the session ended or aborted (`on_turn_end`).

Between a turn's end and its blocks' free it waits in `pending_pins.py`;
which queued turns continue which pin (the pinned lane) is
`pinned_lane.py`'s bookkeeping; what a turn that continues its program
teaches as it is admitted or takes its pin over is `resumes.py`'s.

The waiting queue (`waiting_queue.py`) asks `queue` (`queue_rules.py`) for
lanes, keys and who is overdue; those rules read the pins and turns kept
here, at the step clock (`now`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

from vllm_continuum.core.hints import Hints, parse_hints
from vllm_continuum.core.ledger import BlockLedger
from vllm_continuum.core.lost_pin import HostTier, KeepingHostCopies
from vllm_continuum.core.pending_pins import PendingPin, PendingPins
from vllm_continuum.core.pin_maker import PinMaker, PinMakerEvents
from vllm_continuum.core.pin_release import PinReleaser, ReleaseEvents
from vllm_continuum.core.pin_table import Anchor, Pin, PinTable, ReleaseReason
from vllm_continuum.core.pin_value import PoolState
from vllm_continuum.core.pinned_lane import PinnedLane
from vllm_continuum.core.pressure import PressureRule
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.queue_rules import QueueRules
from vllm_continuum.core.reloadable import Reloadable
from vllm_continuum.core.programs import ProgramTable
from vllm_continuum.core.resumes import ResumeEvents, Resumes
from vllm_continuum.core.running_calls import LATE_RETURN_S
from vllm_continuum.core.sessions import session_key
from vllm_continuum.core.tool_calls import ToolCall
from vllm_continuum.core.ttl import NeverTTLPolicy, TTLPolicy
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.turn import Turn, TurnRequest
from vllm_continuum.core.waiting_queue import LaneQueue
from vllm_continuum.core.workload import WorkloadModel

if TYPE_CHECKING:
    from vllm_continuum.config import ContinuumConfig

logger = logging.getLogger("vllm.continuum")
T = TypeVar("T")
ToolCallReader = Callable[[Hints], ToolCall | None]  # the call a finished output makes


class PinEvents(PinMakerEvents, ReleaseEvents, ResumeEvents, Protocol):
    """What the controller reports (`vllm_continuum.metrics.stats.ContinuumStats`
    counts it for `/metrics`)."""

    def on_invalid_hints(self, count: int) -> None: ...
    def on_turn_outcome(self, call_format: str | None) -> None: ...
    def on_tool_duration(self, tool: str, seconds: float) -> None: ...
    def on_ttl_revisit(self, tool: str, more_s: float) -> None: ...
    def on_blocks_short(self) -> None: ...


class PinController:
    """The pin rules' one door: the adapter (adapter/scheduler_mixin.py) calls
    these methods from vLLM's scheduler hooks and reaches nothing behind them.

    It owns the pins (`PinTable`), the session table, the queue rules and the
    two halves of a pin's life: `PinMaker` (a tool-call turn ends: pin its
    context for a TTL) and `PinReleaser` (hand-over, expiry, pressure,
    reset). Every time it compares is its own clock's (`now`)."""

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
        program_order: Callable[[ContinuumConfig], ProgramOrder] = ProgramOrder.of,
        on_lane_change: Callable[[TurnRequest], None] = lambda request: None,
        pool_state: Callable[[Callable[[TurnRequest], bool]], PoolState | None] = lambda counted: None,
        preempted_status: object = "preempted",
        host_tier: HostTier | None = None,
    ) -> None:
        """`host_tier`: vLLM's KV offload to host memory, if on (lost_pin.py): a
        lost pin costs a reload of what it holds. `clock`: the one clock every rule reads (vLLM's wall-clock stamp of a
        request's arrival is converted to it once, by the adapter); `on_lane_change(request)`: a queued request's lane
        changed (a pin of its context appeared or went); `preempted_status`: the
        request status (opaque here) of a preempted request."""
        self.config = config
        self.stats = stats
        self.clock = clock
        self.hash_block_size = hash_block_size
        self.level: Callable[[TurnRequest], int] = (
            (lambda r: r.priority) if by_priority else (lambda r: 0)
        )
        self.workload = WorkloadModel(
            config.duration_history, config.queueing_window, config.program_window
        )
        policy = ttl_policy(config, self.workload)
        if policy.reads_running_calls:
            self.workload.tools.track_running_calls(config.max_ttl_s + LATE_RETURN_S,
                                                    forget_after_s=config.program_idle_horizon_s,
                                                    max_calls=config.max_tracked_sessions)
        # Without prefix caching a pin could never be hit; a policy that never pins
        # takes no block at all (`never` with `queue_order: fcfs` is stock vLLM
        # exactly, the order blocks are freed in included).
        self.pinning = pinning and not isinstance(policy, NeverTTLPolicy)
        self.pins = PinTable()
        self.programs = ProgramTable(config.max_tracked_sessions)
        self.order = program_order(config)
        self.turns: dict[str, Turn] = {}
        self.lane = PinnedLane(self.turns, on_lane_change)  # queued turns, by the pin they continue
        self.pending = PendingPins()  # tool-call turns that ended, their blocks not freed yet
        self._arrivals = itertools.count(1)
        self._seq = 0  # arrivals so far
        self.step = 0  # scheduling steps so far: an expired pin's grace is one of them
        self._step_time: float | None = None  # the clock as the step in progress began
        self._warned_hints: set[str] = set()
        # Where each waiting request goes in the queue, and who is overdue or entitled.
        self.queue = QueueRules(config, turns=self.turns, pins=self.pins, order=self.order,
                                level=self.level, now=self.now, preempted_status=preempted_status,
                                requeue=on_lane_change)
        self._policy = policy
        revisit = self._revisit if hasattr(policy, "revisit") else None
        events = stats if host_tier is None else KeepingHostCopies(stats, host_tier)
        # Which pins the host tier would serve back (none without one, or with the rule off),
        # priced by the TTL rule's prefill profile if it has one.
        self.reloadable = None
        if host_tier is not None and config.reloadable_pins_yield:
            profile = getattr(policy, "profile", None) or PrefillProfile.load_or_default(config.prefill_profile)
            self.reloadable = Reloadable(profile)
        self.releaser = PinReleaser(self.pins, ledger, events, self.queue,
                                    pressure=PressureRule.named(config.pressure_policy), now=self.now,
                                    step=lambda: self.step,
                                    on_gone=self._pin_gone, revisit=revisit)
        # `pool_state`: the pool's free blocks and waiting demand, for `pin_cost:
        # pressure` (None: unknown, Eq. 2's cost), read only when a pin is decided.
        self.maker = PinMaker(config, policy, self.pins, ledger, self.releaser, self.queue, stats,
                              block_size=block_size, hash_block_size=hash_block_size,
                              one_kv_group=one_kv_group, pool_state=pool_state, now=self.now,
                              host_tier=host_tier, reloadable=self.reloadable)
        self.resumes = Resumes(self.workload, stats, host_tier=host_tier,
                               reloadable=self.reloadable, held_now=self.maker.held_now)

    # ------------------------------------------------------------ front door
    def lane_queue(self, queue_cls: type[LaneQueue]) -> LaneQueue:
        """The waiting queue vLLM's scheduler uses (program-level FCFS, lanes, bounds)."""
        return self.queue.lane_queue(queue_cls)

    def profile_note(self, max_model_len: int) -> str | None:
        """What the TTL policy has to say about its prefill profile, if anything."""
        return self.maker.ttl_policy.profile_note(max_model_len)

    def release_expired(self) -> None:
        """Between steps (a request arrives): let pins past their TTL go, with
        the step about to run as their grace."""
        self.releaser.release_expired(grace_until=self.step + 1)

    def release_all(self) -> None:
        """The prefix cache is reset or the engine shuts down: every pin goes."""
        self.releaser.release_all(ReleaseReason.RESET)

    def on_blocks_short(self) -> None:
        """An allocation failed for lack of blocks (before any pin is released):
        the pool is contested (`WorkloadModel.contested`)."""
        self.workload.blocks_short(self.now())
        self.stats.on_blocks_short()

    def retry_with_pins_released(self, request: TurnRequest, retry: Callable[[], T | None],
                                 **allocation) -> T | None:
        """An allocation failed for lack of blocks: release the pins that may
        cover its shortfall and retry once (pin_release.py)."""
        return self.releaser.retry_with_pins_released(request, retry, **allocation)

    def kept_past_ttl(self, pin: Pin) -> bool:
        """Whether the pin is past its TTL, kept for its queued turn (one step of grace)."""
        return self.releaser.kept_past_ttl(pin)

    def session(self, request: TurnRequest) -> str | None:
        """The request's session key, as computed once when it arrived."""
        return self.queue.session(request)

    def _revisit(self, pin: Pin, now: float) -> float:
        """A pin reached its TTL: how much longer the policy holds it, asked
        with the time its tool has run. A pin whose next turn is already
        queued has nothing left to decide (its call returned): it is held,
        as every pin is, up to `max_ttl_s`."""
        if pin.waiters:
            return max(0.0, pin.created_at + self._policy.max_ttl_s - now)
        tenant = pin.program.tenant if pin.program is not None else None
        self.workload.tools.advance(tenant, now)
        more = self._policy.revisit(pin.tool, now - pin.created_at, pin.context_tokens, tenant,
                                    self.maker.held_now(pin))
        self.stats.on_ttl_revisit(pin.tool, more)
        return more

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
        self.workload.tick(self._step_time)
        self.releaser.release_expired(grace_until=self.step)

    def after_step(self, admitted: Iterable[tuple[TurnRequest, int]],
                   first_of: Callable[[int, int], float | None] | None = None) -> None:
        """`admitted`: (request, cached tokens) of each request the step admitted;
        `first_of(bound, level)`: where the first request still waiting under a
        bound at a priority level stands (waiting_queue.py `first_of`; None:
        nobody waits): the bounds forget what nobody waiting can be passed by."""
        for request, num_cached_tokens in admitted:
            self._on_admitted(request, num_cached_tokens)
        self.queue.prune(first_of)

    def end_step(self) -> None:
        """The step is over: rules read the clock again."""
        self._step_time = None

    # --------------------------------------------------------- arrival side
    def on_arrival(self, request: TurnRequest, extra_args: Mapping[str, object] | None,
                   arrived: float | None = None) -> None:
        """A new request: read its hints, and whether it continues its session.
        `arrived`: when it arrived, on the controller's clock (the adapter
        converts vLLM's wall-clock stamp once); never later than now."""
        self._end_idle_programs()
        hints = parse_hints(extra_args, self.config.max_hint_tool_name_length)
        if hints.invalid:
            self._count_invalid_hints(request.request_id, hints, extra_args)
        now = self.now()
        arrival = now if arrived is None else min(arrived, now)
        self._seq = next(self._arrivals)
        turn = Turn(hints, arrival=arrival, program_arrival=arrival, seq=self._seq)
        self.turns[request.request_id] = turn
        session = turn.session = session_key(request.session_id)
        if session is None:
            return
        hashes = request.block_hashes
        program = self.programs.continued_by(session, hashes)
        pin = self.pins.pin_continued_by(session, hashes)
        if program is None and pin is not None and pin.program is not None:
            # The table is bounded and puts idle programs aside; a live pin is
            # the truth about its program whatever the table says.
            program = self.programs.restore(pin.program, now)
        turn.continues = program is not None
        if program is None:  # it continues none of the session's programs: its own
            program = self.programs.open(session, now, arrival, request.cache_salt)
        turn.program, turn.program_arrival = program, program.arrival
        turn.rank = self.order.rank(program)
        measured = self.programs.arrive(program, now)
        if measured is not None:
            tool, seconds = measured
            self.workload.tool_returned(program.tenant, session, tool, seconds)
            self.stats.on_tool_duration(tool, seconds)
        if turn.continues:
            turn.resuming = (pin is not None, now)
        self.lane.queued(request, turn, pin)

    def _end_idle_programs(self) -> None:
        for turns in self.programs.pop_idle(self.now(), self.config.program_idle_horizon_s):
            self.workload.programs.add(turns)

    def _on_admitted(self, request: TurnRequest, num_cached_tokens: int) -> None:
        turn = self.turns.get(request.request_id)
        if turn is not None:
            turn.cached = num_cached_tokens
            self.queue.went_ahead(request, turn)
            self.lane.dequeued(request, turn)
            self.resumes.admitted(request, turn, num_cached_tokens, self.now())
        if turn is None or not turn.handed_over:  # (its allocation mostly did)
            self._hand_over(request, turn)

    # ---------------------------------------------------------- finish side
    def on_finished(
        self, request: TurnRequest, aborted: bool, tool_called: ToolCallReader
    ) -> bool:
        """A finished request whose blocks are freed at once: `on_turn_end`
        then `on_blocks_freed`. True if a pin now holds its blocks."""
        self.on_turn_end(request, aborted, tool_called)
        return self.on_blocks_freed(request, aborted, tool_called)

    def on_turn_end(
        self, request: TurnRequest, aborted: bool, tool_called: ToolCallReader
    ) -> None:
        """A request finished: its turn ends now (the tool starts), even if a KV
        connector keeps its blocks a while longer (it sends them first).
        `tool_called(hints)` reads the call from its output."""
        turn = self.turns.pop(request.request_id, None)
        if turn is None:
            return  # never seen arriving: nothing of ours
        self.lane.dequeued(request, turn)
        program = turn.program
        if program is None:  # no session
            return
        hints, hashes = turn.hints, request.block_hashes
        # A stop string also ends a turn as an abort (the front end aborts
        # it), so an abort with output is judged by that output.
        tool = None
        program.service += max(0, request.num_prompt_tokens - turn.cached) + request.num_output_tokens
        if request.num_output_tokens:
            call = ToolCall(hints.tool, "hint") if hints.tool else tool_called(hints)
            self.stats.on_turn_outcome(call.format if call else None)
            tool = call.name if call else None
            anchor = Anchor.of_prompt(hashes, request.num_prompt_tokens // self.hash_block_size)
            now = self.now()
            self.programs.turn_ended(program, now, tool, anchor)
            if tool is not None:
                self.workload.tool_called(program.tenant, turn.session, tool, now)
        self.programs.left(program)
        if hints.last_turn:
            # It speaks for its own program only (the one it continues, or
            # opened), and releases only the pins whose context it continues:
            # a request that merely carries the id ends and frees nothing of
            # another program's; a fork's other branches expire.
            for pin in self.pins.pins_continued_by(turn.session, hashes):
                self.releaser.release(pin, ReleaseReason.LAST_TURN)
            self.workload.programs.add(self.programs.end(program))
            return
        if tool is None:
            if aborted:
                self.releaser.release_continued(turn.session, hashes, ReleaseReason.ABORTED)
            return
        if self.pinning:
            self.pending.add(request.request_id, PendingPin(turn.session, tool, hints, program, seq=self._seq))

    def on_blocks_freed(
        self, request: TurnRequest, aborted: bool, tool_called: ToolCallReader
    ) -> bool:
        """A finished request's blocks are being freed: True if a pin now holds
        them (the adapter must not free them)."""
        if request.request_id in self.turns:  # freed without its end reported first
            self.on_turn_end(request, aborted, tool_called)
        pending = self.pending.pop(request.request_id)
        if pending is None:
            return False
        if pending.superseded:
            # Freed late (a connector sent the blocks first) after the next turn
            # was allocated: it holds the context already; a pin would only expire.
            return False
        pin = self.maker.pin(request, pending.session, pending.tool, pending.hints, pending.program)
        if pin is None:
            return False
        pending.program.pins += 1
        self.lane.pin_made(pin, pending.seq)
        return True

    def on_allocated(self, request: TurnRequest) -> None:
        """vLLM allocated blocks for a waiting request: its prefix hit is touched,
        so a pin of the context it continues is handed over now, whether vLLM
        schedules it this step or holds it while a connector loads its KV."""
        turn = self.turns.get(request.request_id)
        if turn is not None and turn.continues:
            self.pending.supersede(turn.session, turn.program)  # blocks a connector holds
        self._hand_over(request, turn)
        if turn is not None:
            turn.handed_over = True

    def _hand_over(self, request: TurnRequest, turn: Turn | None) -> None:
        """`turn`: the request's, if it has one (its session is read from it)."""
        session = turn.session if turn is not None else session_key(request.session_id)
        pin = self.pins.pin_continued_by(session, request.block_hashes)
        if pin is not None and pin.request_id != request.request_id:
            self.resumes.handed_over(pin, request)
            self.releaser.release(pin, ReleaseReason.RESUMED)

    def _pin_gone(self, pin: Pin) -> None:
        """A pin left the table: its queued turns leave the pinned lane."""
        if pin.program is not None:
            pin.program.pins -= 1
        self.lane.pin_gone(pin)

    # ------------------------------------------------------------ utilities
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

