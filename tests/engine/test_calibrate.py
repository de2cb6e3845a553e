"""`vllm-continuum calibrate` against a real (tiny) vLLM server: the YAML it
writes is a cost model the simulator runs, its shape is the server's, and it
carries its provenance. A small grid: the full calibration is a benchmark
(docs/calibration.md), and no timing is asserted here (the machine is shared)."""

from __future__ import annotations

import math

import pytest
import yaml


@pytest.mark.engine
def test_calibrate_writes_a_cost_model_the_simulator_runs(live_servers, tmp_path):
    from continuum_lab.calibration.command import run_calibrate
    from continuum_lab.sim.cost_model import load_cost_model
    from continuum_lab.sim.run import simulate
    from continuum_lab.trace_format import Program, Trace, Turn

    server = live_servers["stock"]
    out = tmp_path / "tiny-cpu.yaml"
    # --num-gpu-blocks 7 must lose to what the server says (its pool of 64).
    flags = {"num_gpu_blocks": 7, "block_size": None, "max_num_seqs": None,
             "max_num_batched_tokens": 512, "max_model_len": None}
    assert run_calibrate(server.base_url, out, flags=flags, lengths=[16, 256, 1000], batches=[1, 4],
                         contexts=[64, 256], repeats=1, decode_tokens=48,
                         command="vllm-continuum calibrate (test)") == 0
    cost = load_cost_model(out)
    data = yaml.safe_load(out.read_text())
    assert (cost.kind, cost.num_gpu_blocks, cost.block_size) == ("linear", 64, 32)
    assert cost.max_model_len == 2016 and cost.max_num_batched_tokens == 512
    sources = data["calibration"]["shape_sources"]
    assert sources["num_gpu_blocks"] == "/metrics vllm:cache_config_info"
    assert sources["max_model_len"] == "/v1/models" and sources["max_num_batched_tokens"] == "flag"
    cal = data["calibration"]
    assert cal["command"] == "vllm-continuum calibrate (test)" and cal["machine"]["cpu_count"]
    assert "inter-token" in cost.description and "time to first token" in cost.description
    kinds = [p["kind"] for p in cal["points"]]
    # 3 cold lengths, 2 prefills on a cached prefix, 4 decode points and 2 under a
    # grammar (all fit the pool). A decode whose streams never ran side by side
    # (the API server staggered them: seen on a loaded machine and on a fast one)
    # is listed in not_measured, never the command's end; prefills always measure.
    failed = cal["not_measured"]
    failed_decodes = [f for f in failed if f.startswith("decode ")]
    failed_guided = [f for f in failed if f.startswith("decode-guided ")]
    assert len(failed) == len(failed_decodes) + len(failed_guided), failed
    assert kinds.count("prefill") == 5, failed
    assert kinds.count("decode") + len(failed_decodes) == 4 and kinds.count("decode") >= 2, failed
    chunked = next(p for p in cal["points"] if p["params"] == {"n": 1000, "cached": 0})
    assert len(chunked["steps"]) == 2  # 1000 tokens at 512 a step
    extended = [p for p in cal["points"] if p["kind"] == "prefill" and p["params"]["cached"]]
    assert all(p["detail"]["cache_hit_tokens"] == p["params"]["cached"] // 32 * 32 for p in extended)
    assert all(p["measured_s"] > 0 and math.isfinite(p["fitted_s"]) for p in cal["points"])
    # Under a grammar, at the shortest context: reported beside the fit, not in it.
    guided = cal["guided_decode"]
    assert len(guided) + len(failed_guided) == 2 and guided, failed
    assert all(p["kind"] == "decode-guided" and p["measured_s"] > 0 and p["params"]["context"] == 64
               for p in guided)
    assert set(cal["fit_error"]) == {"prefill", "decode", "all"}
    # What `sim --cost-model FILE` does with it: a short run completes.
    trace = Trace([Program("a", 0.0, (Turn(200, 8, "grep", 0.5), Turn(50, 4))),
                   Program("b", 0.2, (Turn(300, 8),))])
    run, _ = simulate(trace, cost, "stock", None, progress=False)
    assert len(run.programs) == 2 and all(p.jct_s > 0 for p in run.programs)


@pytest.mark.engine
def test_the_speed_probe_measures_what_it_says(live_servers):
    """compare's probe beside each replay (calibration/speed_probe.py): its points are
    calibrate's, the resumed prefill finds its prefix, a decode point is timed at the
    batch that ran side by side, and a cost model reads them into one finite factor."""
    from continuum_lab.calibration.speed_probe import PROBES, REPEATS, probe_speed, speed_factor
    from continuum_lab.sim.cost_model import load_cost_model

    probe = probe_speed(live_servers["stock"].base_url, seed=0)
    records = probe["points"]
    # Every probe is measured or listed as failed (a decode window can fail on a
    # loaded machine; prefills do not), never the caller's end.
    assert len(records) + len(probe["failed"]) == len(PROBES) * REPEATS
    assert [(r["kind"], r["params"]) for r in records if r["kind"] == "prefill"] == [
        ("prefill", {"n": 512, "cached": 0}), ("prefill", {"n": 256, "cached": 1024})] * REPEATS
    assert all(r["measured_s"] > 0 for r in records)
    resumed = [r for r in records if r["kind"] == "prefill" and r["params"]["cached"]]
    assert all(r["detail"]["cache_hit_tokens"] == 1024 for r in resumed)
    # The step a decode point times holds as many decodes as ran side by side: all 4,
    # unless the API server staggered the streams (seen in CI), and the factor reads
    # the point at what it held, not at what was asked.
    decode = [r for r in records if r["kind"] == "decode"]
    assert all(r["params"] == {"batch": 4, "context": 256} for r in decode)
    # Each stream decodes its own context, found cached where the server reports it.
    assert all(not r["detail"]["shared_prefix"] and all(
        hit in (None, 256) for hit in r["detail"]["cache_hit_tokens"]) for r in decode)
    assert all(1 <= r["detail"]["batch_decoding"] <= 4 and r["steps"] == [
        [[1, r["detail"]["context_mid"], r["detail"]["batch_decoding"]]]] for r in decode)
    factor = speed_factor(records, load_cost_model("cpu-bench-2l-quiet"))
    assert math.isfinite(factor) and factor > 0
