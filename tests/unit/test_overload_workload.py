"""The live overload workload (configs/workloads/cpu-overload.yaml): the figures
its header states hold for the trace it generates, on the calibrated CPU cost
model it names (calibration/sizing.py), and one-shot traffic runs until_s."""

from __future__ import annotations

import statistics

from continuum_lab.calibration.sizing import resumed_turn_costs
from continuum_lab.sim.cost_model import load_cost_model
from continuum_lab.workload_spec import load_spec, load_trace


def test_the_pool_holds_about_a_third_and_reprefill_outweighs_decode():
    trace = load_trace("cpu-overload")
    cost = load_cost_model("cpu-bench-2l-calibrated").model_copy(update={"num_gpu_blocks": 375})
    finals = sum(p.final_context_tokens for p in trace.agents)
    assert (len(trace.agents), finals) == (12, 33342)
    assert 0.3 < cost.pool_tokens / finals < 0.4
    rows = resumed_turn_costs(trace, cost, batch=8)
    assert statistics.median(r["reprefill_s"] / r["decode_alone_s"] for r in rows) > 2
    assert statistics.median(r["reprefill_s"] / r["decode_batched_s"] for r in rows) > 1.5


def test_one_shot_traffic_goes_on_until_until_s():
    spec = load_spec("cpu-overload")
    trace = spec.generate()
    last_agent = max(p.arrival_s for p in trace.agents)
    chats = trace.one_shots
    assert len(chats) == 32 and max(p.arrival_s for p in chats) > 3 * last_agent
    assert max(p.arrival_s for p in chats) <= spec.one_shot.until_s
    # Without until_s, as before: until the last agent arrives.
    plain = spec.model_copy(update={"one_shot": spec.one_shot.model_copy(update={"until_s": None})})
    assert max(p.arrival_s for p in plain.generate().one_shots) <= last_agent


def test_the_24_program_batch_is_cpu_overloads_programs_for_a_pool_twice_as_large():
    """cpu-overload-24.yaml's header: the same programs, draw by draw, twice as many,
    arriving twice as fast; the 750-block pool holds about a third of them."""
    small, large = load_trace("cpu-overload"), load_trace("cpu-overload-24")
    assert len(large.agents) == 24 and max(p.arrival_s for p in large.agents) < 15
    for a, b in zip(small.agents, large.agents):
        assert a.turns == b.turns
    finals = sum(p.final_context_tokens for p in large.agents)
    pool = load_cost_model("cpu-bench-2l-calibrated").model_copy(update={"num_gpu_blocks": 750}).pool_tokens
    assert finals == 70424 and 0.3 < pool / finals < 0.4
