"""The Continuum behaviour, grafted onto vLLM's V1 scheduler by a mixin.

`ContinuumSchedulerMixin` goes in front of vLLM's `Scheduler` or
`AsyncScheduler`. Every rule lives in `vllm_continuum.core.controller`
(`PinController`); each hook here forwards to it, at the narrowest point of
vLLM that works:

- `_free_request`: a request finished, its turn ends (a KV connector may
  keep its blocks a while longer, to send them).
- `_free_request_blocks`: the single path by which a request's blocks are
  freed (finish, abort, connector-delayed free, and preemption, which is not
  an end of turn). A finished tool-call turn of a session keeps its
  references instead: a pin.
- `schedule`: expired pins go first; after stock scheduling, a pin whose
  context's next turn was admitted is handed over.
- `kv_cache_manager.allocate_slots` (wrapped per instance): when an
  allocation fails, pins are released before vLLM would preempt a running
  request or give up on admitting a waiting one; once a waiting request's
  allocation holds its prefix hit, the pin it continues is handed over
  (also when vLLM then holds it for an async KV load, out of our queue's sight).
- `self.waiting` (with `queue_order: program_fcfs`): the controller's lane
  queue. With `queue_order: fcfs` vLLM's own queue stays.
- `add_request`, `reset_prefix_cache`, `shutdown`: bookkeeping and release.
- `_update_from_kv_xfer_finished`: with vLLM's KV offload, the loads its
  worker reports (how fast the host tier loads: adapter/host_tier.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from vllm.logger import init_logger
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.request import Request, RequestStatus

from vllm_continuum.adapter.block_ledger import VllmBlockLedger
from vllm_continuum.adapter.compat import check_vllm_version
from vllm_continuum.adapter.host_tier import ConnectorHostTier
from vllm_continuum.config import ContinuumConfig, config_from_vllm
from vllm_continuum.core.affinity import AffinityMonitor
from vllm_continuum.core.controller import PinController, ToolCallReader
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.tool_calls import ToolCallDetector, describe, vocab_token_id
from vllm_continuum.core.tool_calls.forced import is_required_schema
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.waiting_queue import LaneQueue
from vllm_continuum.metrics.stats import ContinuumStats

logger = init_logger("vllm.continuum")
HERMES_CALL = "<tool_call>"  # the call token the affinity monitor counts (core/affinity.py)
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)  # an allocation of theirs admits them


class ContinuumWaitingQueue(LaneQueue, RequestQueue):
    """Our waiting queue as vLLM's own kind: a `RequestQueue` (readable by
    index as vLLM's FCFS deque), for code around the scheduler that checks."""


class ContinuumSchedulerMixin:
    def __init__(
        self,
        *args,
        continuum_config: ContinuumConfig | None = None,
        continuum_clock: Callable[[], float] | None = None,
        continuum_wall_clock: Callable[[], float] | None = None,
        continuum_ttl_policy=make_ttl_policy,
        continuum_program_order=ProgramOrder.of,
        continuum_stats: ContinuumStats | None = None,
        **kwargs,
    ) -> None:
        """vLLM passes its own arguments; the `continuum_*` ones are for
        callers that build a scheduler themselves (the simulator): the config
        (else read from `--additional-config`, see `vllm_continuum.config`),
        the clock (monotonic), the clock requests' `arrival_time` is stamped
        with (vLLM's: `time.time`; a simulator's: its own clock), a TTL policy factory `(config, workload) -> TTLPolicy`,
        a program order factory `config -> ProgramOrder`, and
        the stats (else exported to the plugin's metrics directory, if any)."""
        check_vllm_version()
        super().__init__(*args, **kwargs)
        cfg = continuum_config or config_from_vllm(self.vllm_config)
        _set_log_level(cfg.log_level)
        tokenizer = getattr(self.structured_output_manager, "tokenizer", None)
        self._tool_calls = ToolCallDetector(
            tokenizer, parser=cfg.tool_call_parser, tokens=cfg.all_tool_call_tokens,
            patterns=cfg.all_tool_call_patterns)
        self._ledger = VllmBlockLedger(self)
        pinning = bool(self.cache_config.enable_prefix_caching)
        self._stats = continuum_stats if continuum_stats is not None else ContinuumStats()
        self._wall_clock = continuum_wall_clock or continuum_clock or time.time
        self._host_tier = ConnectorHostTier.of(self)
        self.continuum = PinController(
            cfg,
            self._ledger,
            self._stats,
            block_size=self.block_size,
            hash_block_size=getattr(self, "hash_block_size", self.block_size) or self.block_size,
            one_kv_group=len(self.kv_cache_config.kv_cache_groups) == 1,
            by_priority=self.policy == SchedulingPolicy.PRIORITY,
            pinning=pinning,
            clock=continuum_clock or time.monotonic,
            ttl_policy=continuum_ttl_policy,
            program_order=continuum_program_order,
            on_lane_change=self._lane_changed,
            pool_state=self._ledger.pool_state,
            preempted_status=RequestStatus.PREEMPTED,
            host_tier=self._host_tier,
        )
        self._affinity = AffinityMonitor(
            vocab_token_id(tokenizer, cfg.tool_result_token),
            vocab_token_id(tokenizer, HERMES_CALL),
            on_miss=self._stats.on_affinity_miss,
            max_sessions=cfg.max_tracked_sessions,
        )
        note = self.continuum.profile_note(self.max_model_len)
        if note:
            logger.warning("continuum: %s", note)
        if not pinning:
            logger.warning(
                "continuum: prefix caching is off (--no-enable-prefix-caching), so a pin "
                "could never be hit: nothing is pinned; queue_order=%s still applies",
                cfg.queue_order,
            )
        # Requests whose lane changed while vLLM was between peek and pop of
        # the waiting queue: re-sorted only once schedule() is done.
        self._in_schedule = False
        self._lane_changes: dict[str, Request] = {}
        assert not self.waiting, "the waiting queue is replaced before any request"
        if cfg.queue_order != "fcfs":
            self.waiting = self.continuum.lane_queue(ContinuumWaitingQueue)
        self._stock_allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_slots_or_release_pins
        logger.info("vllm-continuum scheduler %s: %s", type(self).__name__, cfg.summary())
        logger.log(*describe(self._tool_calls))

    # ------------------------------------------------------------------ hooks
    def add_request(self, request: Request) -> None:
        c = self.continuum
        c.release_expired()
        if request.request_id not in self.requests:
            params = request.sampling_params
            c.on_arrival(request, getattr(params, "extra_args", None) if params is not None else None,
                         arrived=self._arrived(request))
            try:
                self._affinity.on_arrival(
                    c.session(request), request.request_id,
                    request.prompt_token_ids or (),
                )
            except Exception:  # noqa: BLE001  (a signal must never fail a request)
                logger.debug("continuum: affinity signal failed", exc_info=True)
        super().add_request(request)
        self._publish()  # the engine wakes: the front end must stop judging idle pins

    def schedule(self, *args, **kwargs):
        # Between begin_step and end_step the controller reads one time and the
        # queue's lanes stay as they are: vLLM peeks, works, then pops (see
        # core/waiting_queue.py), and must pop what it peeked.
        c = self.continuum
        c.begin_step()
        self._in_schedule = True
        try:
            output = super().schedule(*args, **kwargs)
            if output.scheduled_new_reqs:
                admitted = [
                    (self.requests[new.req_id], new.num_computed_tokens)
                    for new in output.scheduled_new_reqs if new.req_id in self.requests
                ]
                c.after_step(admitted, self._first_waiting())
        finally:
            c.end_step()
            self._in_schedule = False
            for request in self._lane_changes.values():
                self._requeue(request)
            self._lane_changes.clear()
        return output  # published after update_from_output, once per step

    def update_from_output(self, *args, **kwargs):
        outputs = super().update_from_output(*args, **kwargs)
        self._publish()
        return outputs

    def finish_requests(self, *args, **kwargs):
        finished = super().finish_requests(*args, **kwargs)
        self._publish()
        return finished

    def _free_request(self, request: Request, *args, **kwargs):
        # The turn ends when the request finishes, even if a KV connector keeps
        # its blocks until it has sent them (then _free_request_blocks runs later).
        try:
            self._affinity.on_finish(
                self.continuum.session(request), request.request_id, request.output_token_ids
            )
        except Exception:  # noqa: BLE001  (a signal must never fail a request)
            logger.debug("continuum: affinity signal failed", exc_info=True)
        self.continuum.on_turn_end(request, *self._finish_of(request))
        if self._host_tier is not None:
            self._host_tier.forget(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    def _free_request_blocks(self, request: Request) -> None:
        if request.is_finished() and self.continuum.on_blocks_freed(request, *self._finish_of(request)):
            return  # the pin now holds the request's blocks
        super()._free_request_blocks(request)

    def _finish_of(self, request: Request) -> tuple[bool, ToolCallReader]:
        """(aborted?, a reader of the call it made) of a finished request: its
        output, read as its hints say (its parser; whether the call was
        forced, also as vLLM's `required` JSON schema shows it)."""
        return (
            request.status == RequestStatus.FINISHED_ABORTED,
            lambda hints: self._tool_calls.tool_called(
                request.output_token_ids, hints.tool_parser,
                forced=hints.tool_forced or is_required_schema(_guided_json(request))),
        )

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        # Pinned blocks are referenced, and a referenced block fails the reset.
        self.continuum.release_all()
        self._publish()
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        self.continuum.release_all()
        self._publish()
        super().shutdown()

    def _allocate_slots_or_release_pins(self, request: Request, *args, **kwargs):
        """vLLM's allocate_slots; when it fails for lack of blocks, the
        controller may release pins that cover the shortfall and retry once."""
        admitting = request.status in _ADMITTING
        blocks = self._stock_allocate_slots(request, *args, **kwargs)
        if blocks is None:
            self.continuum.on_blocks_short()
            if self.continuum.pins:
                hit = kwargs.get("new_computed_blocks", args[2] if len(args) > 2 else None)
                blocks = self.continuum.retry_with_pins_released(
                    request,
                    lambda: self._stock_allocate_slots(request, *args, **kwargs),
                    shortfall=self._ledger.shortfall(request, args, kwargs),
                    keep=self._ledger.block_ids(hit),
                    running=request.status == RequestStatus.RUNNING,
                    preempted=request.status == RequestStatus.PREEMPTED,
                    waiting=request.status == RequestStatus.WAITING,
                    anything_running=bool(self.running),
                )
        if blocks is not None and admitting:
            if self._host_tier is not None:
                self._host_tier.allocated(request.request_id, kwargs.get("num_external_computed_tokens", 0))
            self.continuum.on_allocated(request)
        return blocks

    def _update_from_kv_xfer_finished(self, kv_connector_output, *args, **kwargs):
        if self._host_tier is not None:
            self._host_tier.observe(kv_connector_output)
        return super()._update_from_kv_xfer_finished(kv_connector_output, *args, **kwargs)

    # ----------------------------------------------------------- plumbing
    def _publish(self) -> None:
        """Offer the current state to the metrics exporter (it rate-limits)."""
        stats = self.__dict__.get("_stats")  # None: built without __init__ (vLLM's own tests do)
        if stats is None or stats.writer is None:
            return  # not exported (simulation, offline use): nothing to offer
        c = self.continuum
        stats.publish(
            pins=c.pins, pool_size=self._ledger.pool_size, now=c.clock(),
            idle=not self.has_requests(), kept_past_ttl=c.kept_past_ttl,
        )

    def _arrived(self, request: Request) -> float:
        """vLLM's wall-clock `arrival_time`, once, on the controller's clock: now
        less the time the request took to get here (never negative). Requests
        keep the order of their stamps, as vLLM's priority queue orders them."""
        c = self.continuum
        return c.now() - max(0.0, self._wall_clock() - request.arrival_time)

    def _first_waiting(self) -> Callable[[int, int], float | None] | None:
        """Where the first request waiting under each bound stands, per priority
        level (`LaneQueue.first_of`; None: nobody waits): the bounds forget
        what nobody waiting can be passed by. vLLM's own queue (`queue_order:
        fcfs`) is not indexed: its marks are kept while anyone waits (few: one
        per step that pins held the head back, per level)."""
        if not self.waiting:
            return None
        if isinstance(self.waiting, LaneQueue):
            return self.waiting.first_of
        return lambda bound, level: -math.inf

    def _lane_changed(self, request: Request) -> None:
        if self._in_schedule:
            self._lane_changes[request.request_id] = request
        else:
            self._requeue(request)

    def _requeue(self, request: Request) -> None:
        if isinstance(self.waiting, LaneQueue):
            self.waiting.requeue(request)


def _guided_json(request: Request) -> object:
    """The request's guided-JSON schema, if any (core/tool_calls/forced.py)."""
    guided = getattr(request.sampling_params, "structured_outputs", None)
    return getattr(guided, "json", None)


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
