"""`compare --step-log`'s recorders (continuum_lab/step_recorder.py) on a real
vLLM scheduler: each records every step it runs, what the step held and how long
it took, and decides nothing (the same run, step for step, as the class it wraps)."""

from __future__ import annotations

import pytest
from tests.scheduler.harness import BLOCK_SIZE, Driver, make_request, tokens

from vllm_continuum.config import load_config
from continuum_lab.prediction.step_speed import step_kind
from continuum_lab.step_log import RECORDERS, STEP_LOG_KEY, read_steps
from continuum_lab.step_recorder import ContinuumStepRecorder, StockStepRecorder
from continuum_lab.sim.driver import new_scheduler


def _run(cls, model_dir, additional_config=None, **kwargs):
    """Two requests, one 100-token prompt chunked by 64 and one short one arriving
    a step later, to the end; the scheduled tokens of every step."""
    scheduler = new_scheduler(cls, model_dir, num_blocks=64, block_size=BLOCK_SIZE, max_model_len=4096,
                              max_num_seqs=8, max_num_batched_tokens=64,
                              additional_config=additional_config, **kwargs)
    driver = Driver(scheduler)
    long = driver.add(make_request(tokens(1, 100), max_tokens=3))
    schedule = [dict(driver.step().num_scheduled_tokens)]
    short = driver.add(make_request(tokens(2, 20), max_tokens=2))
    while not (long.is_finished() and short.is_finished()):
        schedule.append(dict(driver.step().num_scheduled_tokens))
    return schedule


@pytest.mark.parametrize("recorder", [StockStepRecorder, ContinuumStepRecorder])
def test_a_recorder_records_every_step_and_decides_nothing(tiny_model_dir, tmp_path, recorder):
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_continuum.adapter.scheduler import ContinuumScheduler

    kwargs = {} if recorder is StockStepRecorder else {"continuum_config": load_config(use_env=False)}
    wrapped = Scheduler if recorder is StockStepRecorder else ContinuumScheduler
    path = tmp_path / "steps.jsonl"
    recorded = _run(recorder, tiny_model_dir, {STEP_LOG_KEY: str(path)}, **kwargs)
    plain = _run(wrapped, tiny_model_dir, **kwargs)
    assert [sorted(s.values()) for s in recorded] == [sorted(s.values()) for s in plain]

    steps = read_steps(path)
    assert len(steps) == len(recorded)
    # (new tokens, tokens computed before) per request: the chunked prefill, then
    # the short prompt joining the long one's last chunk, then decodes.
    assert steps[0]["batch"] == [[64, 0]]
    assert sorted(steps[1]["batch"]) == [[20, 0], [36, 64]]
    assert step_kind(steps[1]["batch"]) == "prefill" and step_kind(steps[2]["batch"]) == "decode"
    assert sorted(steps[2]["batch"]) == [[1, 20], [1, 100]]
    assert [sum(n for n, _ in s["batch"]) for s in steps] == [sum(s.values()) for s in recorded]
    assert all(s["step_s"] > 0 for s in steps)
    # The cycle runs to the next step while requests remain; the last step's has none.
    assert all("cycle_s" in s for s in steps[:-1]) and "cycle_s" not in steps[-1]


def test_the_recorders_compare_names_are_the_classes():
    """RECORDERS, what the server's --scheduler-cls is given, names these classes."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(RECORDERS["stock"]) is StockStepRecorder
    assert resolve_obj_by_qualname(RECORDERS["continuum"]) is ContinuumStepRecorder
