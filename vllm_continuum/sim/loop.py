"""The discrete-event simulation: a trace, a scheduler, a cost model, a clock.

Events are turn arrivals (a program's first turn at its arrival time, each
later turn when the previous turn's tool returns). The engine loop mirrors
vLLM's engine core: between steps it adds the requests that arrived, then
one step is `schedule()`, a synthetic model output (each request whose
prefill is complete samples the next token of its scripted output), and
`update_from_output()`. The step's length comes from the cost model; the
simulated clock advances by it, and the scheduler reads that clock. Wall
time is never read (except, optionally, to time the scheduler calls).

Prompts are token ids that grow as an agent's history does: turn k+1's
prompt is turn k's prompt, turn k's output tokens (the simulated model emits
exactly the trace's output, so the history matches what the server
generated), then the new tokens of turn k+1. Requests carry the session id
and the continuum hints (`continuum_tool`, `continuum_last_turn`); one-shot
requests (chat traffic) carry neither, as the replay client sends them, and
are recorded apart from the agents (`RunResult.one_shot`).

Beside the records, the loop measures the KV pool's occupancy (the fraction
of blocks referenced, as vLLM's `kv_cache_usage_perc` gauge, once the step is
scheduled) weighted by step time: how much pressure a load puts on the pool.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from dataclasses import dataclass, field

from vllm_continuum.bench.replay import ProgramRecord, RunResult, TurnRecord, continuum_hints
from vllm_continuum.bench.trace import Program, Trace
from vllm_continuum.sim.cost_model import CostModel
from vllm_continuum.sim.engine import SimClock, build_scheduler

EOS_TOKEN_ID = 0
TOKEN_RANGE = (100, 2300)  # ordinary tokens of the tiny tokenizer (no EOS, no <tool_call>)


@dataclass
class _Live:
    program: Program
    turn: int
    arrival: float
    prompt: list[int]
    output: list[int]
    first_scheduled: float | None = None
    first_token: float | None = None
    cached: int | None = None


@dataclass
class SimStats:
    steps: int = 0
    idle_jumps: int = 0
    stalls: int = 0  # schedule() returned nothing while work was queued
    scheduled_tokens: int = 0
    busy_s: float = 0.0
    scheduler_wall_s: list[float] = field(default_factory=list)  # per step, if timed
    scheduler_cpu_s: list[float] = field(default_factory=list)  # this thread's CPU time, per step
    preemptions: int = 0
    usage_s: float = 0.0  # sum over steps of the pool's occupancy x the step's time
    usage_max: float = 0.0

    @property
    def usage_mean(self) -> float:
        return self.usage_s / self.busy_s if self.busy_s else 0.0


def _tokens(seed: int, program: str, turn: int, what: str, n: int) -> list[int]:
    rng = random.Random(f"{seed}/{program}/{turn}/{what}")
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


class Simulation:
    def __init__(
        self,
        trace: Trace,
        cost: CostModel,
        policy: str,
        *,
        seed: int = 0,
        prefill_profile_path: str | None = None,
        extra_settings: dict[str, str] | None = None,
        time_scheduler: bool = False,
        progress=None,
    ) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.trace = trace
        self.cost = cost
        self.policy = policy
        self.seed = seed
        self.clock = SimClock(0.0)
        self._next_tool_s: dict[str, float] = {}
        built = build_scheduler(
            policy, cost, self.clock,
            prefill_profile_path=prefill_profile_path,
            extra_settings=extra_settings,
            oracle_durations=self._next_tool_s.get,
        )
        self.scheduler = built.scheduler
        self.settings = built.settings
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(cost.block_size, hash_fn)
        self._time_scheduler = time_scheduler
        self._progress = progress
        self._ids = itertools.count()
        self.stats = SimStats()
        self.result = RunResult(label=policy, started_at=0.0, duration_s=0.0)

    # ------------------------------------------------------------- requests
    def _request(self, live: _Live):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        program, turn = live.program, live.program.turns[live.turn]
        xargs = None if program.one_shot else continuum_hints(turn)
        params = SamplingParams(max_tokens=turn.output_tokens, ignore_eos=True, extra_args=xargs)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        return Request(
            request_id=f"{program.id}/{live.turn}/{next(self._ids)}",
            prompt_token_ids=live.prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=live.arrival,
            block_hasher=self._hasher,
            session_id=None if program.one_shot else program.id,
        )

    # ----------------------------------------------------------------- loop
    def run(self) -> RunResult:
        from vllm.v1.outputs import ModelRunnerOutput

        s = self.scheduler
        clock = self.clock
        events: list[tuple[float, int, _Live]] = []
        seq = itertools.count()
        for program in self.trace:
            prompt = _tokens(self.seed, program.id, 0, "new", program.turns[0].new_tokens)
            live = _Live(program, 0, program.arrival_s, prompt,
                         _tokens(self.seed, program.id, 0, "out", program.turns[0].output_tokens))
            heapq.heappush(events, (program.arrival_s, next(seq), live))
        live_by_id: dict[str, _Live] = {}
        prev_prompt: dict[str, int] = {}
        timed = self._time_scheduler
        stats = self.stats
        while True:
            while events and events[0][0] <= clock.now:
                _, _, live = heapq.heappop(events)
                turn = live.program.turns[live.turn]
                self._next_tool_s[live.program.id] = turn.tool_s if turn.tool else None
                request = self._request(live)
                live_by_id[request.request_id] = live
                s.add_request(request)
            if not s.has_unfinished_requests():
                if not events:
                    break
                clock.now = events[0][0]
                stats.idle_jumps += 1
                continue
            if timed:
                t0, c0 = time.perf_counter(), time.thread_time()
            out = s.schedule()
            if timed:
                t_sched, c_sched = time.perf_counter() - t0, time.thread_time() - c0
            if out.total_num_scheduled_tokens == 0:
                stats.stalls += 1
                if not events:
                    raise RuntimeError(
                        f"{self.policy}: nothing schedulable and no arrival pending "
                        f"(waiting {len(s.waiting)}, running {len(s.running)})"
                    )
                clock.now = max(clock.now, events[0][0])
                continue
            usage = s.kv_cache_manager.usage  # what this step holds, before finished requests free theirs
            for new in out.scheduled_new_reqs:
                live = live_by_id[new.req_id]
                if live.first_scheduled is None:
                    live.first_scheduled = clock.now
                    live.cached = new.num_computed_tokens
            batch, req_ids, sampled = [], [], []
            for req_id, n in out.num_scheduled_tokens.items():
                request = s.requests[req_id]
                batch.append((n, request.num_computed_tokens - n))
                req_ids.append(req_id)
                if request.num_computed_tokens >= request.num_tokens:
                    live = live_by_id[req_id]
                    sampled.append([live.output[request.num_output_tokens]])
                else:
                    sampled.append([])
            dt = self.cost.step_time(batch)
            clock.now += dt
            stats.steps += 1
            stats.busy_s += dt
            stats.usage_s += usage * dt
            stats.usage_max = max(stats.usage_max, usage)
            stats.scheduled_tokens += out.total_num_scheduled_tokens
            stats.preemptions += len(getattr(out, "preempted_req_ids", ()) or ())
            runner_out = ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
            )
            if timed:
                t1, c1 = time.perf_counter(), time.thread_time()
            engine_outputs = s.update_from_output(out, runner_out)
            if timed:
                stats.scheduler_wall_s.append(t_sched + time.perf_counter() - t1)
                stats.scheduler_cpu_s.append(c_sched + time.thread_time() - c1)
            for outputs in engine_outputs.values():
                for o in outputs.outputs:
                    live = live_by_id.get(o.request_id)
                    if live is None:
                        continue
                    if live.first_token is None and o.new_token_ids:
                        live.first_token = clock.now
                    if o.finish_reason is not None:
                        del live_by_id[o.request_id]
                        self._turn_done(live, clock.now, prev_prompt, events, seq)
        self.result.duration_s = clock.now
        self.result.sort()
        self.result.meta.update({
            "policy": self.policy,
            "settings": self.settings,
            "steps": stats.steps,
            "stalls": stats.stalls,
            "busy_s": stats.busy_s,
            "preemptions": stats.preemptions,
            "pool_usage_mean": stats.usage_mean,
            "pool_usage_max": stats.usage_max,
        })
        cs = getattr(s, "continuum_stats", None)
        if cs is not None:
            self.result.meta["continuum_stats"] = {
                "pins_by_tool": dict(cs.pins_by_tool),
                "releases_by_reason": dict(cs.releases_by_reason),
                "resumes_by_outcome": dict(cs.resumes_by_outcome),
                "pins_refused_by_cap": cs.pins_refused_by_cap,
            }
        return self.result

    def _turn_done(self, live: _Live, now: float, prev_prompt: dict, events, seq) -> None:
        program, k = live.program, live.turn
        turn = program.turns[k]
        self.result.record(
            TurnRecord(
                program=program.id,
                turn=k,
                tool=turn.tool,
                sent_s=live.arrival,
                ttft_s=(live.first_token or now) - live.arrival,
                latency_s=now - live.arrival,
                prompt_tokens=len(live.prompt),
                cached_tokens=live.cached or 0,
                output_tokens=len(live.output),
                prev_prompt_tokens=prev_prompt.get(program.id, 0),
            ),
            program.one_shot,
        )
        if self._progress is not None:
            self._progress.update()
        if k + 1 < len(program.turns):
            prev_prompt[program.id] = len(live.prompt)
            nxt = program.turns[k + 1]
            prompt = live.prompt + live.output + _tokens(self.seed, program.id, k + 1, "new",
                                                         nxt.new_tokens)
            arrival = now + turn.tool_s
            heapq.heappush(events, (arrival, next(seq), _Live(
                program, k + 1, arrival, prompt,
                _tokens(self.seed, program.id, k + 1, "out", nxt.output_tokens))))
        elif not program.one_shot:
            prev_prompt.pop(program.id, None)
            self.result.programs.append(
                ProgramRecord(program.id, program.arrival_s, now, len(program.turns))
            )
