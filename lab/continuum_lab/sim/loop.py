"""The discrete-event simulation: a trace, N engines behind a router, a cost model, a clock.

Events are turn arrivals (a program's first turn at its arrival time, each
later turn when the previous turn's tool returns). Each engine (instance.py)
mirrors vLLM's engine core: between steps it adds the requests routed to it
that arrived, then one step is `schedule()`, a synthetic model output
(driver.py: each request whose prefill is complete samples the next token of
its scripted output), and `update_from_output()`. The step's length comes from the cost
model; the engine's `update_from_output()` runs when the simulated clock
reaches the step's end, and every scheduler reads that clock. Wall time is
never read (except, optionally, to time the scheduler calls).

With one engine (the default) this is the single-server simulation; with N,
a router (routing.py) picks each arriving request's engine, and the engines
step concurrently on the shared clock: at each moment, steps that end
finish first (in instance order), then arrivals are routed, then every
engine without a step in flight starts one.

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
With a router it also records where each turn went and, for continuum, how
many resumed turns reached the engine holding their session's pin
(`RunResult.meta["cluster"]`).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.sim.cost_model import CostModel
from continuum_lab.sim.driver import (
    SimClock,
    block_hasher,
    random_tokens,
    synthetic_output,
    synthetic_request,
)
from continuum_lab.sim.instance import Instance, SimStats, Step
from continuum_lab.sim.oracle import Hindsight, PressureReleases
from continuum_lab.sim.policies import build_scheduler
from continuum_lab.sim.routing import make_router
from continuum_lab.trace_format import Program, Trace, continuum_hints


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
    loaded: int = 0  # of `cached`, tokens loaded from the host tier


def _tokens(seed: int, program: str, turn: int, what: str, n: int) -> list[int]:
    return random_tokens(f"{seed}/{program}/{turn}/{what}", n)


def _merge_counts(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _merge_tier_stats(parts) -> dict:
    """Host-tier counters of several engines: sums, per direction where they are per direction."""
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            if isinstance(v, dict):
                out[k] = _merge_counts([out.get(k, {}), v])
            else:
                out[k] = out.get(k, 0) + v
    return out


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
        instances: int = 1,
        routing: str | None = None,
        routing_options: dict | None = None,
        hindsight: Hindsight = Hindsight(),
    ) -> None:
        """instances > 1 needs a routing (routing.py); a routing with one instance
        is allowed (it records where turns went, trivially). hindsight: what an
        oracle policy knows from earlier runs (oracle.py)."""
        if instances < 1 or (instances > 1 and routing is None):
            raise ValueError(f"{instances} instances need a routing")
        self.trace = trace
        self.cost = cost
        self.policy = policy
        self.seed = seed
        self.clock = SimClock(0.0)
        self._next_tool_s: dict[str, float] = {}
        self._programs = {p.id: p for p in trace}
        self._hindsight = hindsight
        self.admission_waits: dict[tuple[str, int], float] = {}  # (program, turn) -> s
        self.pressure_releases = [PressureReleases() for _ in range(instances)]
        built = [
            build_scheduler(
                policy, cost, self.clock,
                prefill_profile_path=prefill_profile_path,
                extra_settings=extra_settings,
                oracle_durations=self._next_tool_s.get,
                oracle_remaining=self._remaining_work,
                stats=self.pressure_releases[i],
            )
            for i in range(instances)
        ]
        self.instances = [Instance(i, b.scheduler, b.worker) for i, b in enumerate(built)]
        self.settings = built[0].settings
        self.router = make_router(routing, instances, **(routing_options or {})) if routing else None
        self._hasher = block_hasher(cost.block_size)
        self._time_scheduler = time_scheduler
        self._progress = progress
        self._ids = itertools.count()
        self._idle_jumps = 0
        self.placements: dict[tuple[str, int], int] = {}  # (program, turn) -> instance
        # Later turns' prompt tokens by where they came from: the GPU's prefix
        # cache (pins included), the host tier (loaded), or computed.
        self.resume_tokens = {"gpu": 0, "host_tier": 0, "computed": 0}
        self.pinned_turns = 0  # resumed turns whose pin some instance held at arrival
        self.reached_pin = 0  # ... that the router sent to that instance
        self.result = RunResult(label=policy, started_at=0.0, duration_s=0.0)

    def _remaining_work(self, session: str, turns_done: int) -> float:
        """The tokens a program's turns from `turns_done` on add (the order oracle)."""
        program = self._programs.get(session)
        if program is None:
            return 0.0
        return float(sum(t.new_tokens + t.output_tokens for t in program.turns[turns_done:]))

    @property
    def scheduler(self):
        """The only engine's scheduler (one instance)."""
        assert len(self.instances) == 1, "several instances: see .instances"
        return self.instances[0].scheduler

    @property
    def stats(self) -> SimStats:
        return SimStats.merged([inst.stats for inst in self.instances], self._idle_jumps)

    # ------------------------------------------------------------- requests
    def _request(self, live: _Live):
        program, turn = live.program, live.program.turns[live.turn]
        return synthetic_request(
            f"{program.id}/{live.turn}/{next(self._ids)}", live.prompt, hasher=self._hasher,
            max_tokens=turn.output_tokens, ignore_eos=True, arrival=live.arrival,
            session=None if program.one_shot and not program.session else program.id,
            xargs=None if program.one_shot else continuum_hints(turn),
        )

    def _route(self, request, live: _Live) -> Instance:
        if self.router is None:
            return self.instances[0]
        chosen = self.router.route(request, self.instances)
        if live.turn > 0:
            holders = [inst.index for inst in self.instances
                       if inst.holds_pin_for(request, self.clock.now)]
            if holders:
                self.pinned_turns += 1
                self.reached_pin += chosen in holders
        self.placements[(live.program.id, live.turn)] = chosen
        inst = self.instances[chosen]
        inst.routed += 1
        return inst

    # ----------------------------------------------------------------- loop
    def run(self) -> RunResult:
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
        while True:
            for inst in self.instances:
                if inst.step is not None and inst.step.end <= clock.now:
                    self._finish_step(inst, live_by_id, prev_prompt, events, seq)
            while events and events[0][0] <= clock.now:
                _, _, live = heapq.heappop(events)
                turn = live.program.turns[live.turn]
                self._next_tool_s[live.program.id] = self._hindsight.pin_s(
                    live.program.id, live.turn, turn.tool_s if turn.tool else None)
                request = self._request(live)
                live_by_id[request.request_id] = live
                self._route(request, live).inbox.append(request)
            for inst in self.instances:
                if inst.step is None:
                    self._start_step(inst, live_by_id)
            ends = [inst.step.end for inst in self.instances if inst.step is not None]
            # With a host tier the engine also steps for copies in flight (`has_requests`).
            ends += [t for inst in self.instances if inst.worker is not None and inst.step is None
                     and (t := inst.worker.next_done()) is not None]
            if events:
                ends.append(events[0][0])
            if not ends:
                stuck = [inst for inst in self.instances if inst.scheduler.has_unfinished_requests()]
                if stuck:
                    s = stuck[0].scheduler
                    raise RuntimeError(
                        f"{self.policy}: nothing schedulable and no arrival pending "
                        f"(instance {stuck[0].index}: waiting {len(s.waiting)}, running {len(s.running)})"
                    )
                break
            if not any(inst.step is not None or inst.scheduler.has_unfinished_requests()
                       for inst in self.instances):
                self._idle_jumps += 1
            clock.now = min(ends)
        return self._finish_result()

    def _start_step(self, inst: Instance, live_by_id: dict[str, _Live]) -> None:
        """Add what was routed here, then schedule a step (if there is work).
        With a host tier, vLLM's engine core also steps for the KV connector
        alone (`has_requests`): a step with nothing to compute is the
        connector's round trip (host_tier.py), at once, and the scheduler is
        asked again if it brought a load's completion."""
        s, clock, stats, worker = inst.scheduler, self.clock, inst.stats, inst.worker
        for request in inst.inbox:
            s.add_request(request)
        inst.inbox.clear()
        while s.has_requests() if worker is not None else s.has_unfinished_requests():
            timed = self._time_scheduler
            if timed:
                t0, c0 = time.perf_counter(), time.thread_time()
            out = s.schedule()
            if timed:
                t_sched, c_sched = time.perf_counter() - t0, time.thread_time() - c0
            start = clock.now if worker is None else worker.start(out.kv_connector_metadata, clock.now)
            runner_out, batch = synthetic_output(
                s, out, lambda request: live_by_id[request.request_id].output[request.num_output_tokens]
            )
            if out.total_num_scheduled_tokens == 0:
                stats.stalls += 1  # retried at the next moment anything happens
                if worker is None:
                    return
                if start > clock.now:  # held for a flush: the step ends when it is done
                    inst.step = Step(out, runner_out, start)
                    return
                runner_out.kv_connector_output = worker.finish(out.kv_connector_metadata, start,
                                                               idle=True)
                s.update_from_output(out, runner_out)
                if not runner_out.kv_connector_output.finished_recving:
                    return
                continue
            usage = s.kv_cache_manager.usage  # what this step holds, before finished requests free theirs
            for new in out.scheduled_new_reqs:
                live = live_by_id[new.req_id]
                if live.first_scheduled is None:
                    live.first_scheduled = clock.now
                    self.admission_waits[(live.program.id, live.turn)] = clock.now - live.arrival
                    live.cached = new.num_computed_tokens
            dt = self.cost.step_time(batch)
            if worker is not None:
                dt += worker.extra_step_s(start, dt)
            stats.steps += 1
            stats.busy_s += dt + start - clock.now
            stats.usage_s += usage * dt
            stats.usage_max = max(stats.usage_max, usage)
            stats.scheduled_tokens += out.total_num_scheduled_tokens
            stats.preemptions += len(getattr(out, "preempted_req_ids", ()) or ())
            inst.step = Step(out, runner_out, start + dt)
            if timed:
                inst.step.sched_wall_s, inst.step.sched_cpu_s = t_sched, c_sched
            return

    def _finish_step(self, inst: Instance, live_by_id, prev_prompt, events, seq) -> None:
        step, inst.step = inst.step, None
        s, now, worker = inst.scheduler, self.clock.now, inst.worker
        if worker is not None:
            step.runner_output.kv_connector_output = worker.finish(
                step.output.kv_connector_metadata, step.end)
        timed = self._time_scheduler
        if timed:
            t1, c1 = time.perf_counter(), time.thread_time()
        engine_outputs = s.update_from_output(step.output, step.runner_output)
        if timed:
            inst.stats.scheduler_wall_s.append(step.sched_wall_s + time.perf_counter() - t1)
            inst.stats.scheduler_cpu_s.append(step.sched_cpu_s + time.thread_time() - c1)
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                live = live_by_id.get(o.request_id)
                if live is None:
                    continue
                if live.first_token is None and o.new_token_ids:
                    live.first_token = now
                if o.finish_reason is not None:
                    del live_by_id[o.request_id]
                    if worker is not None:
                        live.loaded = worker.stats.loaded_tokens.pop(o.request_id, 0)
                    self._turn_done(live, now, prev_prompt, events, seq)

    def _finish_result(self) -> RunResult:
        stats = self.stats
        self.result.duration_s = self.clock.now
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
        all_cs = [cs for inst in self.instances
                  if (cs := getattr(getattr(inst.scheduler, "continuum", None), "stats", None)) is not None]
        if all_cs:
            self.result.meta["continuum_stats"] = {
                "pins_by_tool": _merge_counts(cs.pins_by_tool for cs in all_cs),
                "releases_by_reason": _merge_counts(cs.releases_by_reason for cs in all_cs),
                "resumes_by_outcome": _merge_counts(cs.resumes_by_outcome for cs in all_cs),
                "pins_refused_by_cap": sum(cs.pins_refused_by_cap for cs in all_cs),
            }
        self.result.meta["resume_tokens"] = dict(self.resume_tokens)
        workers = [inst.worker for inst in self.instances if inst.worker is not None]
        if workers:
            self.result.meta["host_tier"] = {"tier": workers[0].tier.label,
                                             **_merge_tier_stats(w.stats.as_dict() for w in workers)}
        if self.router is not None:
            self.result.meta["cluster"] = self._cluster_meta()
        return self.result

    def _cluster_meta(self) -> dict:
        return {
            "instances": len(self.instances),
            "routing": self.router.name,
            "routed": [inst.routed for inst in self.instances],
            "busy_s": [inst.stats.busy_s for inst in self.instances],
            "pool_usage_mean": [inst.stats.usage_mean for inst in self.instances],
            "preemptions": [inst.stats.preemptions for inst in self.instances],
            "pinned_turns": self.pinned_turns,
            "reached_pin": self.reached_pin,
            "placements": [[p, k, i] for (p, k), i in sorted(self.placements.items())],
        }

    def _turn_done(self, live: _Live, now: float, prev_prompt: dict, events, seq) -> None:
        program, k = live.program, live.turn
        turn = program.turns[k]
        if k > 0 and not program.one_shot:
            cached = live.cached or 0
            self.resume_tokens["gpu"] += cached - live.loaded
            self.resume_tokens["host_tier"] += live.loaded
            self.resume_tokens["computed"] += len(live.prompt) - cached
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
