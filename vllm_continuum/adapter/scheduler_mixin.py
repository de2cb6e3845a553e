"""The Continuum behaviour, grafted onto vLLM's V1 scheduler by a mixin.

`ContinuumSchedulerMixin` goes in front of vLLM's `Scheduler` or
`AsyncScheduler` and hooks five points of it, each the narrowest that works:

- `_free_request_blocks`: the single path by which a request's blocks are
  freed (finish, abort, connector-delayed free, and preemption, which is not
  an end of turn). A finished tool-call turn of a session keeps its
  references instead: a pin.
- `schedule`: expired pins go first; after stock scheduling, a pin whose
  context's next turn was admitted is released (the turn already holds the
  blocks, so nothing becomes evictable in between).
- `kv_cache_manager.allocate_slots` (wrapped per instance): when an
  allocation fails, pins are released before vLLM would preempt a running
  request or give up on admitting a waiting one.
- `self.waiting` (with `queue_order: program_fcfs`): a lane queue that puts
  the next turn of a pinned context ahead of other new work, with a waiting
  bound. With `queue_order: fcfs` vLLM's own queue stays.
- `add_request`, `reset_prefix_cache`, `shutdown`: bookkeeping and release.

Policy (TTLs, release choice, queue order, pin accounting) lives in
`vllm_continuum.core`; this file only connects it to vLLM.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from vllm.logger import init_logger
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import Request, RequestStatus

from vllm_continuum.adapter.compat import check_vllm_version
from vllm_continuum.config import ContinuumConfig, load_config
from vllm_continuum.core.hints import NO_HINTS, Hints, parse_hints
from vllm_continuum.core.pin_table import Anchor, Pin, PinTable, ReleaseReason
from vllm_continuum.core.pressure import may_release_pins, pins_to_release
from vllm_continuum.core.sessions import SessionRegistry
from vllm_continuum.core.ttl import TurnEnd, make_ttl_policy
from vllm_continuum.core.waiting_bound import WaitingBound
from vllm_continuum.core.waiting_queue import PINNED, PREEMPTED, REGULAR, LaneQueue
from vllm_continuum.core.workload import WorkloadModel
from vllm_continuum.adapter.block_ledger import BlockLedger
from vllm_continuum.adapter.tool_call_detector import ToolCallDetector
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


@dataclass
class _Turn:
    """What the scheduler keeps about a request until it is freed."""

    hints: Hints
    enqueued_at: float  # scheduler clock: orders arrivals for the waiting bound
    program_arrival: float  # queue key: the program's first arrival if it continues it
    continues: bool = False  # its prompt continues its session's last turn
    first_turn: bool = False  # no turn of its session had ended before it
    resuming: tuple[bool, float] | None = None  # (found a pin, arrival) until admitted


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
        note = getattr(self.ttl_policy, "profile_note", lambda n: None)(self.max_model_len)
        if note:
            logger.warning("continuum: %s", note)
        self.pins = PinTable()
        self.sessions = SessionRegistry(cfg.max_tracked_sessions)
        self.continuum_stats = ContinuumStats()
        self._ledger = BlockLedger(self)
        self._turns: dict[str, _Turn] = {}
        self._warned_hints: set[str] = set()
        self._step = 0  # schedule() calls so far: an expired pin's grace is one of them
        # Sessions whose lane changed while vLLM was between peek and pop of
        # the waiting queue: re-sorted only once schedule() is done.
        self._in_schedule = False
        self._lane_changes: set[str] = set()
        self._tool_calls = ToolCallDetector(
            getattr(self.structured_output_manager, "tokenizer", None),
            cfg.tool_call_token,
            cfg.tool_call_patterns,
        )
        # A pin is only ever useful as a prefix hit.
        self._pinning = bool(self.cache_config.enable_prefix_caching)
        if not self._pinning:
            logger.warning(
                "continuum: prefix caching is off (--no-enable-prefix-caching), so a pin "
                "could never be hit: nothing is pinned; queue_order=%s still applies",
                cfg.queue_order,
            )
        hash_block_size = getattr(self, "hash_block_size", self.block_size) or self.block_size
        self._hash_block_size = hash_block_size
        self._hashes_per_block = max(1, self.block_size // hash_block_size)

        self._bound = WaitingBound(cfg.max_queue_delay_s)
        by_priority = self.policy == SchedulingPolicy.PRIORITY
        self._level = (lambda r: r.priority) if by_priority else (lambda r: 0)
        assert not self.waiting, "the waiting queue is replaced before any request"
        if cfg.queue_order == "program_fcfs":
            self.waiting = LaneQueue(
                lane_of=self._lane_of,
                key_of=self._queue_key,
                session_of=session_key,
                enqueued_at=self._enqueued_at,
                overdue=self._overdue,
                priority_of=self._level,
            )
        self._stock_allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_slots_or_release_pins
        logger.info(
            "vllm-continuum scheduler %s: ttl_policy=%s pressure_policy=%s queue_order=%s "
            "max_queue_delay_s=%s max_pinned_fraction=%s max_ttl_s=%s tool-call token id=%s",
            type(self).__name__,
            cfg.ttl_policy,
            cfg.pressure_policy,
            cfg.queue_order,
            cfg.max_queue_delay_s,
            cfg.max_pinned_fraction,
            cfg.max_ttl_s,
            self._tool_calls.token_id,
        )

    # ------------------------------------------------------------------ hooks
    def add_request(self, request: Request) -> None:
        self._release_expired(grace_until=self._step + 1)
        if request.request_id not in self.requests:
            self._end_idle_programs()
            self._on_arrival(request)
        super().add_request(request)
        self._publish()  # the engine wakes: the front end must stop judging idle pins

    def schedule(self, *args, **kwargs):
        self._step += 1
        self._release_expired(grace_until=self._step)
        self._in_schedule = True
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._in_schedule = False
            for session in self._lane_changes:
                self._reclassify(session)
            self._lane_changes.clear()
        for new_req in output.scheduled_new_reqs:
            self._on_admitted(new_req.req_id, new_req.num_computed_tokens)
        if output.scheduled_new_reqs and isinstance(self.waiting, LaneQueue):
            oldest = self.waiting.oldest_enqueued_at()
            self._bound.prune(oldest if oldest is not None else self.clock())
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
            turn = self._turns.pop(request.request_id, None)
            if self._end_of_turn(request, turn):
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
            held=lambda session: any(p.grace_step is not None for p in self.pins.of_session(session)),
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
        now = self.clock()
        turn = _Turn(hints, enqueued_at=now, program_arrival=request.arrival_time)
        self._turns[request.request_id] = turn
        session = session_key(request)
        if session is None:
            return
        arrival = self.sessions.observe_arrival(
            session, request.arrival_time, now, request.block_hashes
        )
        turn.continues, turn.first_turn = arrival.continues, arrival.first_turn
        if arrival.measured is not None:
            tool, seconds = arrival.measured
            self.workload.durations.add(tool, seconds)
            self.continuum_stats.on_tool_duration(tool, seconds)
        if arrival.continues:
            turn.program_arrival = arrival.state.first_arrival
            had_pin = self.pins.continued_by(session, request.block_hashes) is not None
            turn.resuming = (had_pin, now)

    def _end_idle_programs(self) -> None:
        horizon = self.continuum_config.program_idle_horizon_s
        for _, turns in self.sessions.pop_idle(self.clock(), horizon):
            self.workload.programs.add(turns)

    def _on_admitted(self, request_id: str, num_cached_tokens: int) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        turn = self._turns.get(request_id)
        if turn is not None:
            self._bound.went_ahead(turn.enqueued_at, self._level(request), self.clock())
        if turn is not None and turn.resuming is not None:
            had_pin, arrived = turn.resuming
            turn.resuming = None
            if not had_pin:  # T: what turns that lost their cache waited
                self.workload.queueing.add(self.clock() - arrived)
            self.continuum_stats.on_resume(had_pin, request.num_prompt_tokens, num_cached_tokens)
        pin = self.pins.continued_by(session_key(request), request.block_hashes)
        if pin is not None and pin.request_id != request_id:
            # The turn's allocation touched the pinned blocks it hit: hand over.
            self._release(pin, ReleaseReason.RESUMED)

    def _queue_key(self, request: Request) -> tuple:
        """Program-level FCFS: by the program's first arrival, then the request's."""
        turn = self._turns.get(request.request_id)
        program = turn.program_arrival if turn is not None else request.arrival_time
        return (program, request.arrival_time, request.request_id)

    def _enqueued_at(self, request: Request) -> float:
        turn = self._turns.get(request.request_id)
        return turn.enqueued_at if turn is not None else self.clock()

    def _lane_of(self, request: Request) -> int:
        if request.status == RequestStatus.PREEMPTED:
            return PREEMPTED
        pinned = self.pins.continued_by(session_key(request), request.block_hashes)
        return PINNED if pinned is not None else REGULAR

    def _overdue(self, request: Request) -> bool:
        """Its extra wait lasted the bound: it goes first, and pins give way to it."""
        turn = self._turns.get(request.request_id)
        return (
            turn is not None
            and request.status == RequestStatus.WAITING
            and self._bound.overdue(turn.enqueued_at, self._level(request), self.clock())
        )

    # ------------------------------------------------------------ finish side
    def _end_of_turn(self, request: Request, turn: _Turn | None) -> bool:
        """Decide what a finished request means for its session; True if pinned."""
        session = session_key(request)
        if session is None:
            return False
        hints = turn.hints if turn is not None else NO_HINTS
        # Only the program's own turns (its first, or one continuing its last)
        # speak for the session; a request that merely carries the id does not.
        of_program = turn is None or turn.continues or turn.first_turn
        hashes = request.block_hashes
        # A stop string also ends a turn as FINISHED_ABORTED (the front end
        # aborts it), so an abort with output is judged by that output.
        tool = None
        if request.num_output_tokens:
            tool = hints.tool or self._tool_calls.tool_called(request.output_token_ids)
            if of_program:
                anchor = Anchor.of_prompt(hashes, request.num_prompt_tokens // self._hash_block_size)
                self.sessions.observe_turn_end(session, self.clock(), tool, anchor)
        if hints.last_turn:
            if of_program:
                for pin in self.pins.of_session(session):
                    self._release(pin, ReleaseReason.LAST_TURN)
                self.workload.programs.add(self.sessions.end_program(session))
            else:
                self._release_continued(session, hashes, ReleaseReason.LAST_TURN)
            return False
        if tool is None:
            if request.status == RequestStatus.FINISHED_ABORTED:
                self._release_continued(session, hashes, ReleaseReason.ABORTED)
            return False
        if not self._pinning:
            return False
        program_arrival = turn.program_arrival if turn is not None else request.arrival_time
        return self._pin(request, session, tool, hints, program_arrival)

    def _pin(
        self, request: Request, session: str, tool: str, hints: Hints, arrival: float
    ) -> bool:
        blocks, fence = self._ledger.take(request)
        hashes = tuple(request.block_hashes)
        replaced, kept = self._within_session_quota(session, blocks, hashes)
        kept_ids = self._ledger.ids(blocks[:kept])
        kept_hashes = hashes[: kept * self._hashes_per_block]
        anchor = Anchor.of_prompt(kept_hashes, request.num_prompt_tokens // self._hash_block_size)
        ttl_s = 0.0
        if kept_ids and anchor is not None:
            # The TTL is decided on what the pin will actually keep.
            kept_tokens = min(request.num_tokens, kept * self.block_size)
            decision = self.ttl_policy.decide(
                TurnEnd(session, tool, kept_tokens, hinted_ttl_s=hints.ttl_s)
            )
            ttl_s = decision.ttl_s
            self.continuum_stats.on_ttl_decision(tool, ttl_s, decision.source)
            logger.debug(
                "continuum: session=%s tool=%s ttl=%.3fs source=%s",
                session, tool, ttl_s, decision.source,
            )
        victims = self._room_under_cap(kept_ids, replaced, arrival) if ttl_s > 0 else None
        if victims is None:
            if ttl_s > 0:
                self.continuum_stats.on_pin_refused(tool)
            self._ledger.give_back(blocks, fence)
            return False
        self._ledger.give_back(blocks[kept:], fence)
        for old in replaced:
            self._release(old, ReleaseReason.REPLACED)
        for victim in victims:
            self._release(victim, ReleaseReason.PRESSURE)
        now = self.clock()
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
        )
        self.pins.add(pin)
        self.continuum_stats.on_pin(pin)
        self._lane_changed(session)
        return True

    def _within_session_quota(self, session: str, blocks: list, hashes: tuple) -> tuple[list[Pin], int]:
        """(pins the new one replaces, how many leading blocks it keeps) so that
        the session's pins hold at most `max_session_pinned_fraction` of the
        pool in distinct blocks. The first blocks are kept: its next turn hits
        them (hashes chain from the start). Models with several KV cache groups
        cannot be cut that way: all or nothing."""
        quota = int(self.continuum_config.max_session_pinned_fraction * self._ledger.pool_size)
        one_group = len(self.kv_cache_config.kv_cache_groups) == 1
        kept = len(blocks)
        while True:  # fewer kept blocks replace fewer pins: a few rounds at most
            replaced = self.pins.subsumed_by(session, hashes[: kept * self._hashes_per_block])
            others = {b for p in self.pins.of_session(session) if p not in replaced for b in p.block_ids}
            new = [i for i, b in enumerate(self._ledger.ids(blocks[:kept], keep_null=True))
                   if b is not None and b not in others]
            room = quota - len(others)
            if len(new) <= room or kept == 0:
                return replaced, kept
            kept = new[room] if one_group and room > 0 else 0

    def _room_under_cap(
        self, ids: tuple[int, ...], replaced: list[Pin], arrival: float
    ) -> list[Pin] | None:
        """The pins of later programs to release so that a new pin of `ids`
        fits under `max_pinned_fraction` (distinct blocks, `replaced` gone);
        None if it cannot fit: then nothing is released."""
        cap = int(self.continuum_config.max_pinned_fraction * self._ledger.pool_size)
        total = self.pins.count_with(ids, without=replaced)
        if total <= cap:
            return []
        candidates = [
            p for p in self.pins.release_order()
            if p.session_arrival > arrival and p not in replaced
        ]
        going = Counter(b for p in replaced for b in p.block_ids)
        victims = pins_to_release(
            candidates, total - cap, lambda b: self.pins.refs(b) - going[b], keep=set(ids)
        )
        return victims or None

    # ---------------------------------------------------------- release side
    def _release(self, pin: Pin, reason: ReleaseReason) -> None:
        if not self.pins.remove(pin):
            return
        self._ledger.give_back(pin.blocks, pin.fence)
        self.continuum_stats.on_release(pin, reason, self.clock())
        self._lane_changed(pin.session_id)

    def _release_continued(self, session: str, hashes, reason: ReleaseReason) -> None:
        pin = self.pins.continued_by(session, hashes)
        if pin is not None:
            self._release(pin, reason)

    def _lane_changed(self, session: str) -> None:
        if self._in_schedule:
            self._lane_changes.add(session)
        else:
            self._reclassify(session)

    def _reclassify(self, session: str) -> None:
        if isinstance(self.waiting, LaneQueue):
            self.waiting.reclassify(session)

    def _release_expired(self, grace_until: int) -> None:
        """The TTL is a hard bound, but for one scheduling step of grace when
        the pinned context's next turn is already queued (it is being admitted)."""
        if not self.pins:
            return
        for pin in self.pins.expired(self.clock()):
            if pin.grace_step is None and self._next_turn_waiting(pin):
                pin.grace_step = grace_until
            if pin.grace_step is not None and self._step <= pin.grace_step:
                self.pins.requeue(pin)
            else:
                self._release(pin, ReleaseReason.EXPIRED)

    def _next_turn_waiting(self, pin: Pin) -> bool:
        if isinstance(self.waiting, LaneQueue) and not self.waiting.has_session_waiting(pin.session_id):
            return False
        return pin.anchor is not None and any(
            session_key(r) == pin.session_id and pin.anchor.continued_by(r.block_hashes)
            for r in self.waiting
        )

    def _allocate_slots_or_release_pins(self, request: Request, *args, **kwargs):
        """vLLM's allocate_slots, but an allocation that fails for lack of blocks
        releases the pins that cover the shortfall (as the pressure policy
        allows) and retries once, before vLLM preempts or stops admitting. If
        no set of pins covers it, nothing is released."""
        blocks = self._stock_allocate_slots(request, *args, **kwargs)
        if blocks is not None or not self.pins:
            return blocks
        ledger = self._ledger
        hit = kwargs.get("new_computed_blocks", args[2] if len(args) > 2 else None)
        candidates = [p for p in self.pins.release_order() if ledger.can_give_back_now(p.fence)]
        needed = ledger.shortfall(request, args, kwargs)
        victims = pins_to_release(candidates, needed, ledger.ref_count, keep=ledger.block_ids(hit))
        if not victims:
            return None
        if not may_release_pins(
            self.continuum_config.pressure_policy,
            request.status == RequestStatus.RUNNING,
            anything_running=bool(self.running),
            preempted=request.status == RequestStatus.PREEMPTED,
            overdue=self._overdue(request),
        ):
            # Pins could make room but are kept: everyone waiting waits for them.
            self._bound.held_by_pins(self._level(request), self.clock())
            return None
        for pin in victims:
            self.pins.remove(pin)
            ledger.give_back(pin.blocks, pin.fence)
        blocks = self._stock_allocate_slots(request, *args, **kwargs)
        if blocks is None:  # the estimate was wrong: restore, nothing was taken
            logger.debug("continuum: %d pins did not cover the shortfall of %s; kept",
                         len(victims), request.request_id)
            for pin in victims:
                ledger.take_back(pin.blocks)
                self.pins.add(pin)
            return None
        now = self.clock()
        for pin in victims:
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
