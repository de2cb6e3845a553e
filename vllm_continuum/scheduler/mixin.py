"""The Continuum behaviour, grafted onto vLLM's V1 scheduler by a mixin.

`ContinuumSchedulerMixin` goes in front of vLLM's `Scheduler` or
`AsyncScheduler` and hooks five points of it, each the narrowest that works:

- `_free_request_blocks`: the single path by which a request's blocks are
  freed (finish, abort, connector-delayed free, and preemption, which is not
  an end of turn). A finished tool-call turn of a session keeps its
  references instead: a pin.
- `schedule`: expired pins go first; after stock scheduling, a pin whose
  session's next turn was admitted is released (the turn already holds the
  blocks, so nothing becomes evictable in between).
- `kv_cache_manager.allocate_slots` (wrapped per instance): when an
  allocation fails, pins are released before vLLM would preempt a running
  request or give up on admitting a waiting one.
- `self.waiting`: a lane queue that puts a pinned session's turn ahead of
  other new work (never ahead of preempted requests).
- `add_request`, `reset_prefix_cache`, `shutdown`: bookkeeping and release.

Policy (TTLs, release order, queue order) lives in `vllm_continuum.policy`;
this file only connects it to vLLM.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from vllm.logger import init_logger
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import Request, RequestStatus

from vllm_continuum.compat import check_vllm_version
from vllm_continuum.config import ContinuumConfig, load_config
from vllm_continuum.policy.hints import NO_HINTS, Hints, parse_hints
from vllm_continuum.policy.pin_table import Pin, PinTable, ReleaseReason
from vllm_continuum.policy.pressure import may_release_pins
from vllm_continuum.policy.sessions import SessionRegistry
from vllm_continuum.policy.ttl import TurnEnd, make_ttl_policy
from vllm_continuum.policy.workload import WorkloadModel
from vllm_continuum.policy.waiting_queue import PINNED, PREEMPTED, REGULAR, LaneQueue
from vllm_continuum.scheduler.blocks import BlockLedger
from vllm_continuum.scheduler.tool_call_detector import ToolCallDetector
from vllm_continuum.stats import ContinuumStats

logger = init_logger("vllm.continuum")

_MAX_SESSION_KEY_LENGTH = 128


def session_key(request: Request) -> str | None:
    """The session a request belongs to, as the pin machinery keys it.

    Client-chosen ids can be huge; long ones are kept as a fixed-size digest.
    """
    session = request.session_id
    if not session or len(session) <= _MAX_SESSION_KEY_LENGTH:
        return session or None
    return "sha256:" + hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()


def _set_log_level(level: str | None) -> None:
    """vLLM's handler filters at VLLM_LOGGING_LEVEL; a finer level for our
    logger alone gets its own handler, with vLLM's format."""
    if level is None:
        return
    logger.setLevel(level)
    parent = logging.getLogger("vllm")
    if (
        not logger.handlers
        and parent.handlers
        and all(h.level > logger.level for h in parent.handlers)
    ):
        handler = logging.StreamHandler()
        handler.setFormatter(parent.handlers[0].formatter)
        logger.addHandler(handler)
        logger.propagate = False


class ContinuumSchedulerMixin:
    def __init__(self, *args, **kwargs) -> None:
        check_vllm_version()
        self.continuum_config: ContinuumConfig = load_config()
        super().__init__(*args, **kwargs)
        cfg = self.continuum_config
        _set_log_level(cfg.log_level)
        self.clock: Callable[[], float] = time.monotonic
        self.workload = WorkloadModel(
            cfg.duration_history, cfg.queueing_window, cfg.program_window
        )
        self.ttl_policy = make_ttl_policy(cfg, self.workload)
        self.pins = PinTable()
        self.sessions = SessionRegistry(cfg.max_tracked_sessions)
        self.continuum_stats = ContinuumStats()
        self._ledger = BlockLedger(self)
        self._hints: dict[str, Hints] = {}
        # Turns of sessions seen before: request id -> (its session had a pin, arrival).
        self._resuming: dict[str, tuple[bool, float]] = {}
        self._warned_hints: set[str] = set()
        # Sessions whose lane changed while vLLM was between peek and pop of
        # the waiting queue: re-sorted only once schedule() is done.
        self._in_schedule = False
        self._lane_changes: set[str] = set()
        self._tool_calls = ToolCallDetector(
            getattr(self.structured_output_manager, "tokenizer", None),
            cfg.tool_call_token,
            cfg.tool_call_patterns,
        )

        assert not self.waiting, "the waiting queue is replaced before any request"
        self._by_priority = self.policy == SchedulingPolicy.PRIORITY
        self.waiting = LaneQueue(
            lane_of=self._lane_of, key_of=self._queue_key, session_of=session_key
        )
        self._stock_allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_slots_or_release_pins
        logger.info(
            "vllm-continuum scheduler %s: ttl_policy=%s pressure_policy=%s "
            "max_pinned_fraction=%s max_ttl_s=%s tool-call token id=%s",
            type(self).__name__,
            cfg.ttl_policy,
            cfg.pressure_policy,
            cfg.max_pinned_fraction,
            cfg.max_ttl_s,
            self._tool_calls.token_id,
        )

    # ------------------------------------------------------------------ hooks
    def add_request(self, request: Request) -> None:
        self._release_expired()
        if request.request_id not in self.requests:
            self._end_idle_programs()
            self._on_arrival(request)
        super().add_request(request)
        self._publish()  # the engine wakes: the front end must stop judging idle pins

    def schedule(self, *args, **kwargs):
        self._release_expired()
        self._in_schedule = True
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._in_schedule = False
            for session in self._lane_changes:
                self.waiting.reclassify(session)
            self._lane_changes.clear()
        for new_req in output.scheduled_new_reqs:
            self._on_admitted(new_req.req_id, new_req.num_computed_tokens)
        return output  # published after update_from_output, once per step

    def update_from_output(self, *args, **kwargs):
        outputs = super().update_from_output(*args, **kwargs)
        self._publish()
        return outputs

    def finish_requests(self, *args, **kwargs):
        finished = super().finish_requests(*args, **kwargs)
        self._publish()
        return finished

    def _free_request_blocks(self, request: Request) -> None:
        if request.is_finished():
            hints = self._hints.pop(request.request_id, NO_HINTS)
            self._resuming.pop(request.request_id, None)
            if self._end_of_turn(request, hints):
                return  # the pin now holds the request's blocks
        super()._free_request_blocks(request)

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        # Pinned blocks are referenced, and a referenced block fails the reset.
        self.release_all_pins(ReleaseReason.RESET)
        self._publish()
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        self.release_all_pins(ReleaseReason.RESET)
        self._publish()
        super().shutdown()

    def _publish(self) -> None:
        """Offer the current state to the metrics exporter (it rate-limits)."""
        if self.continuum_stats.writer is None:
            return  # not exported (simulation, offline use): nothing to offer
        self.continuum_stats.publish(
            pins=self.pins,
            pool_size=self._ledger.pool_size,
            now=self.clock(),
            idle=not self.has_requests(),
            held=self.waiting.has_session_waiting,
        )

    # ----------------------------------------------------------- public API
    def release_all_pins(self, reason: ReleaseReason) -> None:
        for pin in self.pins:
            self._release(pin, reason)

    # ---------------------------------------------------------- arrival side
    def _on_arrival(self, request: Request) -> None:
        params = request.sampling_params
        extra = getattr(params, "extra_args", None) if params is not None else None
        hints = parse_hints(extra, self.continuum_config.max_hint_tool_name_length)
        if hints.invalid:
            self._count_invalid_hints(request, hints, extra)
        if hints is not NO_HINTS:
            self._hints[request.request_id] = hints
        session = session_key(request)
        if session is None:
            return
        now = self.clock()
        state, measured = self.sessions.observe_arrival(session, request.arrival_time, now)
        if measured is not None:
            tool, seconds = measured
            self.workload.durations.add(tool, seconds)
            self.continuum_stats.on_tool_duration(tool, seconds)
        if state.turns > 0:
            self._resuming[request.request_id] = (self.pins.get(session) is not None, now)

    def _end_idle_programs(self) -> None:
        horizon = self.continuum_config.program_idle_horizon_s
        for _, turns in self.sessions.pop_idle(self.clock(), horizon):
            self.workload.programs.add(turns)

    def _on_admitted(self, request_id: str, num_cached_tokens: int) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        resuming = self._resuming.pop(request_id, None)
        if resuming is not None:
            had_pin, arrived = resuming
            if not had_pin:  # T: what turns that lost their cache waited
                self.workload.queueing.add(self.clock() - arrived)
            self.continuum_stats.on_resume(had_pin, request.num_prompt_tokens, num_cached_tokens)
        pin = self.pins.get(session_key(request))
        if pin is not None and pin.request_id != request_id:
            # The turn's allocation touched the pinned blocks it hit: hand over.
            self._release(pin, ReleaseReason.RESUMED)

    def _queue_key(self, request: Request) -> tuple:
        """Program-level FCFS: by the session's first arrival, then the request's."""
        program = self.sessions.first_arrival(session_key(request), request.arrival_time)
        key = (program, request.arrival_time, request.request_id)
        return (request.priority, *key) if self._by_priority else key

    def _lane_of(self, request: Request) -> int:
        if request.status == RequestStatus.PREEMPTED:
            return PREEMPTED
        return PINNED if self.pins.get(session_key(request)) is not None else REGULAR

    # ------------------------------------------------------------ finish side
    def _end_of_turn(self, request: Request, hints: Hints) -> bool:
        """Decide what a finished request means for its session; True if pinned."""
        session = session_key(request)
        if session is None:
            return False
        # A stop string also ends a turn as FINISHED_ABORTED (the front end
        # aborts it), so an abort with output is judged by that output.
        tool = None
        if request.num_output_tokens:
            tool = hints.tool or self._tool_calls.tool_called(request.output_token_ids)
            self.sessions.observe_turn_end(session, self.clock(), tool)
        if hints.last_turn:
            self._release_session(session, ReleaseReason.LAST_TURN)
            self.workload.programs.add(self.sessions.end_program(session))
            return False
        if tool is None:
            if request.status == RequestStatus.FINISHED_ABORTED:
                self._release_session(session, ReleaseReason.ABORTED)
            return False
        turn = TurnEnd(
            session_id=session,
            tool=tool,
            num_context_tokens=request.num_tokens,
            hinted_ttl_s=hints.ttl_s,
        )
        decision = self.ttl_policy.decide(turn)
        self.continuum_stats.on_ttl_decision(tool, decision.ttl_s, decision.source)
        logger.debug(
            "continuum: session=%s tool=%s ttl=%.3fs source=%s",
            session, tool, decision.ttl_s, decision.source,
        )
        if decision.ttl_s <= 0:
            return False
        self._pin(request, tool, decision.ttl_s)
        return True

    def _pin(self, request: Request, tool: str, ttl_s: float) -> None:
        session = session_key(request)
        blocks, fence = self._ledger.take(request)
        self._release_session(session, ReleaseReason.REPLACED)
        blocks = self._within_session_quota(blocks, fence)
        num_blocks = self._ledger.count(blocks)
        arrival = self.sessions.first_arrival(session, request.arrival_time)
        if num_blocks == 0 or not self._make_room_under_cap(num_blocks, arrival):
            if num_blocks:
                self.continuum_stats.on_pin_refused(tool)
            self._ledger.give_back(blocks, fence)
            return
        now = self.clock()
        pin = Pin(
            session_id=session,
            request_id=request.request_id,
            tool=tool,
            blocks=blocks,
            num_blocks=num_blocks,
            created_at=now,
            expires_at=now + ttl_s,
            session_arrival=arrival,
            fence=fence,
        )
        self.pins.add(pin)
        self.continuum_stats.on_pin(pin)
        self._lane_changed(session)

    def _within_session_quota(self, blocks: list, fence: int) -> list:
        """Keep at most `max_session_pinned_fraction` of the pool for one session:
        the first blocks, which its next turn hits (hashes chain from the start).
        Models with several KV cache groups cannot be cut that way: all or nothing."""
        quota = int(self.continuum_config.max_session_pinned_fraction * self._ledger.pool_size)
        if self._ledger.count(blocks) <= quota:
            return blocks
        if len(self.kv_cache_config.kv_cache_groups) > 1:
            self._ledger.give_back(blocks, fence)
            return []
        self._ledger.give_back(blocks[quota:], fence)
        return blocks[:quota]

    def _make_room_under_cap(self, num_blocks: int, session_arrival: float) -> bool:
        """Fit a new pin under `max_pinned_fraction`, releasing pins of programs
        that arrived later than this one; False if it cannot fit."""
        cap = int(self.continuum_config.max_pinned_fraction * self._ledger.pool_size)
        if num_blocks > cap:
            return False
        for victim in self.pins.release_order():
            if self.pins.num_pinned_blocks + num_blocks <= cap:
                break
            if victim.session_arrival <= session_arrival:
                return False
            self._release(victim, ReleaseReason.PRESSURE)
        return self.pins.num_pinned_blocks + num_blocks <= cap

    # ---------------------------------------------------------- release side
    def _release(self, pin: Pin, reason: ReleaseReason) -> None:
        if self.pins.get(pin.session_id) is not pin:
            return
        self.pins.pop(pin.session_id)
        self._ledger.give_back(pin.blocks, pin.fence)
        self.continuum_stats.on_release(pin, reason, self.clock())
        self._lane_changed(pin.session_id)

    def _lane_changed(self, session: str) -> None:
        if self._in_schedule:
            self._lane_changes.add(session)
        else:
            self.waiting.reclassify(session)

    def _release_session(self, session: str, reason: ReleaseReason) -> None:
        pin = self.pins.get(session)
        if pin is not None:
            self._release(pin, reason)

    def _release_expired(self) -> None:
        if not self.pins:
            return
        for pin in self.pins.expired(self.clock()):
            if self.waiting.has_session_waiting(pin.session_id):
                self.pins.requeue(pin)  # its next turn is queued: keep for hand-off
            else:
                self._release(pin, ReleaseReason.EXPIRED)

    def _allocate_slots_or_release_pins(self, request: Request, *args, **kwargs):
        """vLLM's allocate_slots, but an allocation that fails for lack of blocks
        releases pins (latest-arriving program first, as the pressure policy
        allows) and retries, before vLLM preempts or stops admitting. If even
        that fails, the pins are restored: nothing is released for nothing."""
        blocks = self._stock_allocate_slots(request, *args, **kwargs)
        if blocks is not None or not self.pins:
            return blocks
        running = request.status == RequestStatus.RUNNING
        policy = self.continuum_config.pressure_policy
        if not may_release_pins(policy, running, anything_running=bool(self.running)):
            return None
        hit = kwargs.get("new_computed_blocks", args[2] if len(args) > 2 else None)
        hit_ids = self._ledger.block_ids(hit)
        released: list[Pin] = []
        for pin in self.pins.release_order():
            if not self._ledger.can_give_back_now(pin.fence):
                continue
            if self._ledger.freeable(pin.blocks, hit_ids) == 0:
                continue
            self.pins.pop(pin.session_id)
            self._ledger.give_back(pin.blocks, pin.fence)
            released.append(pin)
            blocks = self._stock_allocate_slots(request, *args, **kwargs)
            if blocks is not None:
                break
        if blocks is None:
            for pin in released:  # restore: allocation failed, nothing was taken
                self._ledger.take_back(pin.blocks)
                self.pins.add(pin)
            return None
        now = self.clock()
        for pin in released:
            self.continuum_stats.on_release(pin, ReleaseReason.PRESSURE, now)
            self._lane_changed(pin.session_id)
        return blocks

    # ------------------------------------------------------------ utilities
    def _count_invalid_hints(self, request: Request, hints: Hints, extra) -> None:
        self.continuum_stats.on_invalid_hints(len(hints.invalid))
        for key in hints.invalid:
            value = repr(extra.get(key))[:80]
            if key not in self._warned_hints:
                self._warned_hints.add(key)
                logger.warning(
                    "continuum: ignoring invalid hint %s=%s on request %s (further "
                    "invalid %s hints are only counted)", key, value, request.request_id, key,
                )
            else:
                logger.debug("continuum: ignoring invalid hint %s=%s", key, value)
