"""The calibration's fit (continuum_lab/calibration/fit.py) and plan, on points
made from a known cost model: the fit must give the model back."""

from __future__ import annotations

import pytest

from continuum_lab.calibration.fit import combine_repeats, fit_points
from continuum_lab.calibration.grid import decode_fits, plan
from continuum_lab.calibration.probes import Point, steady_step_s
from continuum_lab.calibration.server import ServerShape
from continuum_lab.sim.cost_model import CostModel, Linear

TRUE = CostModel(name="t", kind="linear", block_size=32, num_gpu_blocks=160, max_num_seqs=128,
                 max_num_batched_tokens=2048, max_model_len=4096, api_overhead_s=0.05,
                 linear=Linear(step_s=0.02, per_token_s=3e-4, per_pair_s=2e-8, per_seq_s=1e-3,
                               per_decode_kv_s=5e-7))


def _points(cost: CostModel) -> list[Point]:
    """What the probes would measure on a server that steps exactly as `cost` says."""
    points = []
    for n, cached in [(16, 0), (256, 0), (1024, 0), (3000, 0), (512, 1024), (512, 2048)]:
        steps = [[s] for s in cost.prefill_steps(n, cached)]
        points.append(Point("prefill", {"n": n, "cached": cached}, steps,
                            cost.prefill_seconds(n, cached) + cost.api_overhead_s, True))
    for b, c in [(1, 128), (4, 2048), (16, 128), (16, 1024), (8, 2048)]:
        batch = [(1, c)] * b
        points.append(Point("decode", {"batch": b, "context": c}, [batch], cost.step_time(batch), False))
    return points


def test_fit_gives_a_known_model_back():
    fit = fit_points(_points(TRUE))
    for key, value in TRUE.linear.model_dump().items():
        assert fit.coefficients[key] == pytest.approx(value, rel=1e-6), key
    assert fit.api_overhead_s == pytest.approx(0.05, rel=1e-6)
    assert fit.error_summary()["all"]["max_abs_relative_error"] < 1e-6
    # A chunked prefill (3000 > 2048 batched tokens) is two steps.
    assert len(next(p for p in fit.points if p.params["n"] == 3000).steps) == 2


def test_a_term_the_data_contradicts_is_held_at_zero():
    """Points from a model without a per-sequence cost, plus noise that would make
    its least-squares estimate negative: it ends at 0, not below."""
    cost = TRUE.model_copy(update={"linear": Linear(step_s=0.02, per_token_s=3e-4,
                                                    per_pair_s=2e-8, per_seq_s=0.0,
                                                    per_decode_kv_s=5e-7)})
    points = _points(cost)
    for p in points:
        if p.kind == "decode" and p.params["batch"] == 16:
            p.measured_s *= 0.9  # big batches faster than the model: a negative per-seq cost
    fit = fit_points(points)
    assert fit.coefficients["per_seq_s"] == 0.0
    assert all(v >= 0 for v in fit.coefficients.values())


def test_a_decode_window_with_most_streams_apart_is_refused():
    """Eight streams that never overlapped (each read after the one before had
    finished): the widest window holds one stream, not a step of batch 8; three
    of four side by side still time a batch of three."""
    serial = [[(s + 0.02 * k, 1) for k in range(48)] for s in range(8)]
    with pytest.raises(RuntimeError, match="only 1 of 8"):
        steady_step_s(serial)
    overlapping = [[(0.02 * k, 1) for k in range(48)] for _ in range(3)] + [serial[5]]
    assert steady_step_s(overlapping)[1]["batch_decoding"] == 3


def test_decode_attention_is_its_own_term():
    """A decode reads its whole context for one query: the step model's decode KV
    term counts the decodes' context entries, nothing of a prefill's, so a model
    without it understates a batch of long distinct contexts."""
    from continuum_lab.sim.cost_model import StepFeatures

    f = StepFeatures.of([(1, 2000), (1, 1000), (512, 1024)])
    assert (f.decodes, f.decode_kv) == (2, 3000)
    without = TRUE.model_copy(update={"linear": TRUE.linear.model_copy(update={"per_decode_kv_s": 0})})
    batch = [(1, 2048)] * 8
    assert TRUE.step_time(batch) - without.step_time(batch) == pytest.approx(8 * 2048 * 5e-7)


def test_repeats_combine_by_their_median_and_point_round_trip():
    spike = Point("decode", {"batch": 1, "context": 128}, [[(1, 160)]], 0.5, False)
    normal = [Point("decode", {"batch": 1, "context": 128}, [[(1, 160)]], t, False) for t in (0.02, 0.03)]
    (combined,) = combine_repeats([spike, *normal])
    assert combined.measured_s == 0.03 and combined.detail["repeats_s"] == [0.5, 0.02, 0.03]
    # A repeat that ran another batch (staggered streams) lends the point neither
    # its time nor its steps: the point is the repeat at the median.
    odd = Point("decode", {"batch": 4, "context": 64}, [[(1, 80)]], 1e-5, False)
    full = [Point("decode", {"batch": 4, "context": 64}, [[(1, 80)] * 4], t, False) for t in (0.03, 0.02)]
    (combined,) = combine_repeats([odd, *full])
    assert (combined.measured_s, combined.steps) == (0.02, [[(1, 80)] * 4])
    batch = Point("decode", {"batch": 3, "context": 64}, [[(1, 80)] * 3], 0.1, False)
    assert batch.to_json()["steps"] == [[[1, 80, 3]]]
    assert Point.from_json(batch.to_json()) == batch


def test_steady_window_reads_the_step_time_of_interleaved_streams():
    """Two streams: one token every 0.1 s; the second starts 0.25 s late and ends
    0.05 s before the first. Inside the window (0.25 to 1.95 s) both see 0.1 s a token."""
    a = [(0.1 * k, 1) for k in range(1, 21)]
    b = [(0.25 + 0.1 * k, 1) for k in range(0, 18)]
    step, detail = steady_step_s([a, b])
    assert step == pytest.approx(0.1)
    assert detail["window_s"] == pytest.approx(1.95 - 0.25)


def test_plan_keeps_what_the_pool_holds():
    shape = ServerShape("m", {"num_gpu_blocks": 160, "block_size": 32, "max_num_seqs": 128,
                              "max_num_batched_tokens": 2048, "max_model_len": 4096})
    # Each stream has its own prefix: 2 x 66 blocks fit 160, 4 x 66 do not.
    assert decode_fits(shape, 2, 2040, 48) and not decode_fits(shape, 4, 2040, 48)
    assert decode_fits(shape, 16, 128, 48) and not decode_fits(shape, 64, 128, 48)
    probes, skipped = plan(shape, lengths=None, batches=[1, 64], contexts=None, repeats=2,
                           decode_tokens=48)
    lengths = sorted({args[0] for kind, args in probes if kind == "prefill" and args[1] == 0})
    assert lengths == [16, 128, 256, 512, 1024, 2048, 4080]  # past 2048: chunked
    assert ("prefill", (512, 1020)) in probes and probes.count(("prefill", (16, 0))) == 2
    assert ("decode", (1, 4024)) in probes and ("decode", (1, 1020)) in probes
    assert any("B=64 C=128" in s for s in skipped)
    # The grammar's points run at the shortest context, in whatever order contexts come.
    probes, _ = plan(shape, lengths=[16], batches=[1], contexts=[2048, 256], repeats=1,
                     decode_tokens=48)
    assert [args for kind, args in probes if kind == "decode-guided"] == [(1, 256)]


def test_sizing_reads_reprefill_against_decode_by_hand():
    """One program, turn 1 at a 1,000-token history with 100 new tokens and 10
    output tokens, on a model without attention cost: the re-prefill is the
    history's tokens (1,000 x 3e-4 s; same steps: a 1,100-token prefill is one
    step either way), the decode 10 steps of 0.02 + 3e-4 + 1e-3 s alone."""
    from continuum_lab.calibration.sizing import resumed_turn_costs, sizing_report
    from continuum_lab.trace_format import Program, Trace, Turn

    cost = TRUE.model_copy(update={"linear": Linear(step_s=0.02, per_token_s=3e-4, per_pair_s=0.0,
                                                    per_seq_s=1e-3)})
    trace = Trace([Program("a", 0.0, (Turn(990, 10, "grep", 1.0), Turn(100, 10)))])
    (row,) = resumed_turn_costs(trace, cost, batch=4)
    assert row["context"] == 1100
    assert row["reprefill_s"] == pytest.approx(1000 * 3e-4)
    assert row["decode_alone_s"] == pytest.approx(10 * (0.02 + 3e-4 + 1e-3))
    assert row["decode_batched_s"] == pytest.approx(10 * (0.02 + 4 * (3e-4 + 1e-3)))
    report = sizing_report(trace, cost, batch=4)
    assert "the pool holds 4.58 of the final contexts" in report  # 159 x 32 / 1,110


def test_staggered_streams_give_the_step_of_the_batch_that_overlapped():
    """Under load the server may start the last streams after the first finished:
    then the widest window holds fewer streams, and the point says how many."""
    def stream(start, end):
        return [(start + 0.1 * k, 1) for k in range(round((end - start) / 0.1) + 1)]

    step, detail = steady_step_s([stream(0.0, 1.0), stream(0.5, 2.0), stream(1.55, 3.0)])
    assert step == pytest.approx(0.1) and detail["batch_decoding"] == 2
    assert detail["window_s"] == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match="never decoded side by side"):
        steady_step_s([stream(0.0, 0.2), stream(0.15, 0.4)])
    with pytest.raises(RuntimeError, match="at one instant"):
        steady_step_s([[(1.0, 3), (1.0, 2)]])
