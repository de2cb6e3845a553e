"""`bench` and `compare`: replay a workload on a server, or on several servers
one after the other, and print ratios.

`compare` starts stock vLLM and continuum (and optionally other continuum
configurations) one after the other on the same model, KV pool, flags and
trace; each server is idle and freshly started when its replay begins. It
first profiles the prefill time on the stock server (`vllm-continuum
profile`'s measurement) and gives that profile to the continuum servers, as
an operator would. Timings on a shared CPU are noisy: only ratios measured in
one run are reported. With a mixed workload (`--workload cpu-mixed`), the
one-shot requests' TTFT (p50, p99, and p99 over stock's) is reported beside
the agents' figures. `--hints none` replays without any continuum hint
(turn_body.py); `--continuum-settings` adds settings to every continuum
flavour's (flavours.py). Each round's replays are recorded with the trace
they sent (rounds.py), for `vllm-continuum predict`; the report gives each
round against its own stock (means, makespan, outcomes program by program)
and how far stock itself moved between rounds. Right before and after each
replay, a few seconds of calibrate's probes measure the machine's speed
(calibration/speed_probe.py), which predict reads against its cost model.

The flavours with a host tier (`stock-offload`, `default-offload`) run vLLM's
KV offload to host memory, as GPU operators do, through the test host tier
(continuum_lab/host_tier.py), sized `--host-tier-x` times the KV pool; the
report then also sets every flavour against stock + offload. For every
replay it gives where the prompt tokens came from by vLLM's own counters
(computed, GPU prefix cache, host tier) and what the host tier moved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from continuum_lab.calibration.speed_probe import probe_speed
from continuum_lab.live.flavours import (
    COMMON_CONTINUUM_SETTINGS,
    DEFAULT_HOST_TIER_X,
    DEFAULT_LAYERS,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_NUM_BLOCKS,
    DEFAULT_WORKLOAD,
    FLAVOURS,
    START_TIMEOUT_S,
    STOCK,
    STOCK_OFFLOAD,
    host_tier_setup,
)
from continuum_lab.live.replay import replay
from continuum_lab.live.round_report import round_outcomes, round_table
from continuum_lab.live.rounds import save_round
from continuum_lab.live.server_counters import (
    cache_counters, cache_line, continuum_counters, counter_delta, counters_line, engine_preemptions)
from continuum_lab.live.turn_body import HINTS_ALL
from continuum_lab.machine import CpuMeter, load_average
from continuum_lab.publish import publish_report
from continuum_lab.step_log import RECORDERS, STEP_LOG_KEY
from continuum_lab.report import markdown_table, plot_runs, ratio, summarize, write_runs
from continuum_lab.results import RunResult
from continuum_lab.workload_spec import load_trace, trace_for_run


def _report(runs: Sequence[RunResult], out_dir: Path, baseline: str | None, extra: dict) -> str:
    summaries = [summarize(r) for r in runs]
    table = markdown_table(summaries, baseline=baseline)
    write_runs(runs, out_dir, extra={"command": extra.get("command"), "setup": extra})
    plots = plot_runs(runs, out_dir / "plots", title=extra.get("workload", ""))
    (out_dir / "table.md").write_text(table + "\n")
    lines = [table, ""]
    if extra.get("hints"):
        lines.append(f"client hints: {extra['hints']} (`--hints`; none: only the session id, "
                     "the server reads tool calls from the output)")
    base = next((s for s in summaries if s["label"] == baseline), None)
    for s in summaries:
        lines.append(
            f"{s['label']}: {s['programs']} programs, {s['turns']} turns, {s['errors']} errors; "
            f"resumed turns found {s['reuse_of_prev_prompt']:.1%} of the previous prompt cached "
            f"({s['resumed_fully_reused']:.0%} of them all of it)"
        )
        if s["one_shot_requests"]:
            lines.append(f"{s['label']}: {one_shot_line(s, base)}")
    lines.append(f"results: {out_dir / 'results.json'}; plots: {', '.join(str(p) for p in plots)}")
    return "\n".join(lines)


def one_shot_line(s: dict, base: dict | None) -> str:
    """The one-shot traffic's TTFT beside the agents' turns', and its p99 against the baseline's."""
    vs = ratio(s["one_shot_ttft_p99_s"], base["one_shot_ttft_p99_s"]) if base else ""
    return (f"{s['one_shot_requests']} one-shot requests: TTFT p50 {s['one_shot_ttft_p50_s']:.3f} s, "
            f"p99 {s['one_shot_ttft_p99_s']:.3f} s" + (f" ({vs} {base['label']}'s)" if vs else "")
            + f"; agents' turns: TTFT p50 {s['ttft_p50_s']:.3f} s, p99 {s['ttft_p99_s']:.3f} s")


def run_bench(
    url: str,
    workload: str = DEFAULT_WORKLOAD,
    out_dir: Path = Path("runs/bench"),
    *,
    label: str = "server",
    num_programs: int | None = None,
    rate: float | None = None,
    seed: int | None = None,
    time_scale: float = 1.0,
    hints: str = HINTS_ALL,
    command: str = "",
    publish: str | None = None,
) -> int:
    """Replay a workload against one running OpenAI-compatible server."""
    trace = load_trace(workload, num_programs=num_programs, arrival_rate=rate, seed=seed)
    run = replay(url, trace, label=label, time_scale=time_scale, seed=trace.meta.get("seed", 0),
                 hints=hints)
    text = _report([run], out_dir, None, {"workload": workload, "command": command,
                                          "trace": trace.summary(), "hints": hints})
    print(text)
    if publish:
        publish_report(publish, text, command)
    return 1 if run.errors else 0


def _profile_prefill(base_url: str, path: Path, lengths: Sequence[int]) -> dict:
    """Measure the idle server's prefill time (`vllm-continuum profile`), save it for
    the continuum servers, and return what the setup records of it."""
    from vllm_continuum.tools.prefill_probe import measure, report

    print("[compare] profiling prefill time on this idle server", flush=True)
    profile = measure(base_url, lengths=list(lengths), repeats=2)
    profile.save(path)
    print(report(profile), flush=True)
    # The profile's traffic leaves the pool as any idle period would: it stays
    # cached (evictable), as it would on a server that had run before.
    return {"path": str(path), "c0": profile.c0, "c1": profile.c1, "c2": profile.c2,
            "points": [[n, t] for n, t in profile.points]}


def run_compare(
    model_dir: Path | None = None,
    workload: str = DEFAULT_WORKLOAD,
    out_dir: Path = Path("runs/compare"),
    *,
    flavours: Sequence[str] = (STOCK, "continuum"),
    num_layers: int = DEFAULT_LAYERS,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    num_programs: int | None = None,
    rate: float | None = None,
    seed: int | None = None,
    time_scale: float = 1.0,
    prefill_profile: Path | None = None,
    profile_lengths: Sequence[int] = (128, 256, 512, 1024, 2048),
    repeats: int = 1,
    hints: str = HINTS_ALL,
    continuum_settings: dict | None = None,
    step_log: bool = False,
    model_threads: int | None = None,
    host_tier_x: float = DEFAULT_HOST_TIER_X,
    command: str = "",
    publish: str | None = None,
) -> int:
    """Start each flavour's server in turn, replay the same trace, print ratios.

    With repeats > 1 the flavours run in rounds of alternating order (A B, B A,
    A B, ...), so that a drift in the machine's load weighs on each alike; the
    table pools each flavour's programs over its rounds and a second table gives
    each round's ratio to stock."""
    from vllm_continuum.config import load_config
    from continuum_lab.live.bench_model import bench_model
    from continuum_lab.live.flavours import bench_server_env
    from vllm_continuum.tools.local_server import BLOCK_SIZE, flavour_server

    unknown = [f for f in flavours if f not in FLAVOURS]
    if unknown:
        raise SystemExit(f"unknown flavours {unknown}; known: {sorted(FLAVOURS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = str(bench_model(num_layers, model_dir))
    trace = trace_for_run(workload, out_dir, num_programs=num_programs, arrival_rate=rate, seed=seed)
    server_env = bench_server_env(model_threads)
    setup = {
        "command": command,
        "workload": workload,
        "trace": trace.summary(),
        "model": model,
        "num_layers": num_layers,
        "num_blocks": num_blocks,
        "block_size": BLOCK_SIZE,
        "max_model_len": max_model_len,
        "server_env": server_env,
        "flavours": {f: FLAVOURS[f].settings for f in flavours},
        "common_continuum_settings": COMMON_CONTINUUM_SETTINGS,
        "continuum_settings": continuum_settings or {},
        "time_scale": time_scale,
        "hints": hints,
        "repeats": repeats,
    }
    setup["host_tier"] = host_tier_setup(flavours, host_tier_x, num_blocks, num_layers, BLOCK_SIZE)
    host_args = setup["host_tier"].get("args", [])
    print(json.dumps({k: v for k, v in setup.items() if k != "command"}, indent=1))
    rounds: list[list[RunResult]] = [[] for _ in range(repeats)]
    counter_lines: list[str] = []
    cache_lines: list[str] = []
    profile_path = Path(prefill_profile) if prefill_profile else out_dir / "prefill_profile.yaml"
    extra_args = ["--max-model-len", str(max_model_len)]
    schedule = [(r, name) for r in range(repeats)
                for name in (flavours if r % 2 == 0 else list(reversed(flavours)))]
    if not profile_path.exists() and schedule[0][1] != STOCK:
        # A continuum server reads the profile at start-up: measure it on stock
        # (without a host tier's stores) first.
        server = flavour_server("stock", model, out_dir / "logs", num_blocks=num_blocks,
                                extra_args=extra_args, env=server_env)
        server.ready_timeout_s = START_TIMEOUT_S
        print("[compare] measuring the prefill profile on stock", flush=True)
        with server:
            setup["prefill_profile"] = _profile_prefill(server.base_url, profile_path, profile_lengths)
    for round_no, name in schedule:
        flavour = FLAVOURS[name]
        settings = {}
        if flavour.server == "continuum":
            settings = {**COMMON_CONTINUUM_SETTINGS, **flavour.settings,
                        **(continuum_settings or {}), "prefill_profile": str(profile_path)}
        steps_path = out_dir / "steps" / f"r{round_no + 1}-{name}.jsonl" if step_log else None
        if steps_path is not None:
            steps_path.parent.mkdir(parents=True, exist_ok=True)
            steps_path.unlink(missing_ok=True)
        recording = {} if steps_path is None else {
            "scheduler_cls": RECORDERS[flavour.server], "additional_config": {STEP_LOG_KEY: str(steps_path)}}
        server = flavour_server(
            flavour.server, model, out_dir / "logs", num_blocks=num_blocks,
            settings=settings, extra_args=[*extra_args, *(host_args if flavour.host_tier else [])],
            env=server_env, **recording,
        )
        server.log_path = out_dir / "logs" / f"{name}.log"
        server.name = name
        server.ready_timeout_s = START_TIMEOUT_S
        print(f"[compare] round {round_no + 1}/{repeats}: starting {name} "
              f"({flavour.server}, settings {settings})", flush=True)
        with server:
            if not profile_path.exists():
                setup["prefill_profile"] = _profile_prefill(server.base_url, profile_path, profile_lengths)
            # The machine's speed right before and right after the replay
            # (calibration/speed_probe.py), which predict scales its cost model by.
            speed = {"before": probe_speed(server.base_url, seed=round_no)}
            load_before = load_average()
            preempted_before = engine_preemptions(server.base_url)
            cached_before = cache_counters(server.base_url)
            cpu = CpuMeter(server.process.pid)  # its own session: sid == pid
            window = [time.perf_counter()]  # the replay's steps in the step log (not the probes')
            run = replay(server.base_url, trace, label=name, time_scale=time_scale,
                         seed=trace.meta.get("seed", 0), session_prefix=f"{name}-{int(time.time())}-",
                         hints=hints)
            # How busy the machine was (1-minute load average, before and after): the
            # other engineers' jobs share these cores, and predict shows it per replay.
            # And vLLM's preemptions during the replay: prefill the client cannot see.
            window.append(time.perf_counter())
            preempted = engine_preemptions(server.base_url)
            run.meta["cache_counters"] = counter_delta(cached_before, cache_counters(server.base_url))
            cache_lines.append(f"round {round_no + 1}, " + cache_line(name, run.meta["cache_counters"]))
            if steps_path is not None:
                run.meta["step_log"] = {"path": str(steps_path.relative_to(out_dir)), "window": window}
            run.meta.update({"round": round_no + 1, "flavour": name,
                             "load_average": [load_before, load_average()], "cpu": cpu.read(),
                             "preemptions": None if None in (preempted, preempted_before)
                             else preempted - preempted_before})
            speed["after"] = probe_speed(server.base_url, seed=1000 + round_no)
            run.meta["speed_probe"] = speed
            if flavour.server == "continuum":
                # What this server ran with, defaults included: a later `predict` gives
                # the simulator exactly this, whatever the defaults have become.
                run.meta["continuum_settings"] = settings
                run.meta["continuum_config"] = load_config(**settings).model_dump(mode="json")
                run.meta["server_counters"] = continuum_counters(server.base_url)
                if run.meta["server_counters"]:
                    counter_lines.append(f"round {round_no + 1}, " + counters_line(
                        name, run.meta["server_counters"]))
                    print(f"[compare] {counter_lines[-1]}", flush=True)
            rounds[round_no].append(run)
            save_round(run, trace, out_dir)
    runs = [merge_runs([r for rnd in rounds for r in rnd if r.label == name], name)
            for name in flavours]
    text = _report(runs, out_dir, STOCK if STOCK in flavours else None, setup)
    by_round = round_table(rounds)
    (out_dir / "rounds.md").write_text(by_round + "\n")
    text += "\n\n" + by_round
    outcomes = round_outcomes(rounds)
    if outcomes:
        text += "\n\n" + outcomes
    if STOCK_OFFLOAD in flavours:
        text += "\n\nAgainst stock + offload (vLLM's KV offload to host memory, a host tier of "
        text += f"{setup['host_tier']['blocks']} blocks, {host_tier_x:g}x the pool):\n\n"
        text += round_table(rounds, STOCK_OFFLOAD) + "\n\n" + round_outcomes(rounds, STOCK_OFFLOAD)
    text += ("\n\nWhere each replay's prompt tokens came from (vLLM's counters over the replay; "
             "a continuum pin's blocks are found in the GPU prefix cache):\n")
    text += "\n".join(f"- {line}" for line in cache_lines)
    if counter_lines:
        text += "\n\nWhat each continuum server counted (its /metrics at the end of its replay):\n"
        text += "\n".join(f"- {line}" for line in counter_lines)
    print(text)
    if publish:
        publish_report(publish, text, command)
    return 1 if any(r.errors for r in runs) else 0


def merge_runs(runs: Sequence[RunResult], label: str) -> RunResult:
    """One flavour's rounds as one run (program ids prefixed by the round)."""
    if len(runs) == 1:
        return runs[0]
    merged = RunResult(label=label, started_at=runs[0].started_at,
                       duration_s=sum(r.duration_s for r in runs), meta={"rounds": len(runs)})
    for i, r in enumerate(runs, 1):
        merged.programs += [replace(p, program=f"r{i}/{p.program}") for p in r.programs]
        merged.turns += [replace(t, program=f"r{i}/{t.program}") for t in r.turns]
        merged.one_shot += [replace(t, program=f"r{i}/{t.program}") for t in r.one_shot]
        merged.errors += r.errors
    return merged
