"""predict's pieces that need no scheduler: the API overhead's shift, and which
simulated scheduler and settings stand for a live server (prediction/)."""

from __future__ import annotations

import json

import pytest

from vllm_continuum.config import load_config
from continuum_lab.prediction.overhead import as_client_saw, engine_trace
from continuum_lab.prediction.settings import sim_policy
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.sim.policies import sim_config
from continuum_lab.trace_format import Program, Trace, Turn


def test_overhead_moves_the_engine_later_and_the_client_back():
    sent = Trace([Program("a", 1.0, (Turn(10, 2, "grep", 0.5), Turn(5, 1)))])
    engine = engine_trace(sent, 0.1)
    (a,) = engine.programs
    assert a.arrival_s == pytest.approx(1.1)
    assert [t.tool_s for t in a.turns] == pytest.approx([0.6, 0.0])
    # The engine served turn 0 in 0.3 s from receipt; the client saw 0.1 s more.
    run = RunResult("x", 0.0, 5.0, programs=[ProgramRecord("a", 1.1, 3.0, 2)],
                    turns=[TurnRecord("a", 0, "grep", 1.1, 0.2, 0.3, 10, 0, 2, 0)])
    as_client_saw(run, 0.1)
    t = run.turns[0]
    assert (t.sent_s, t.ttft_s, t.latency_s) == pytest.approx((1.0, 0.3, 0.4))
    assert run.programs[0].jct_s == pytest.approx(2.0)


def test_a_continuum_server_is_simulated_with_its_effective_config(tmp_path):
    """The recorded effective config, every field, reaches the simulated scheduler
    as the same config; stock is vLLM's scheduler; a lost profile is said."""
    settings = {"ttl_policy": "forever", "max_session_pinned_fraction": 0.4,
                "tool_ttl_s": {"grep": 1.5}, "prefill_profile": str(tmp_path / "gone.yaml")}
    profile = tmp_path / "p.yaml"
    profile.write_text("c0: 0.1\nc1: 0.001\nc2: 0.0\n")
    live = load_config(use_env=False, **{**settings, "prefill_profile": str(profile)})
    recorded = json.loads(json.dumps(live.model_dump(mode="json")))
    recorded["prefill_profile"] = "elsewhere/p.yaml"  # moved: found beside the run
    recorded["retired_setting"] = 3
    run = RunResult("forever", 0.0, 1.0, meta={"continuum_settings": settings,
                                                 "continuum_config": recorded})
    policy, sim_settings, notes = sim_policy(run, tmp_path)
    assert policy == "default"
    assert sim_settings["PREFILL_PROFILE"] == str(tmp_path / "p.yaml")
    assert sim_config(sim_settings) == live
    assert any("retired_setting" in n for n in notes)
    assert sim_policy(RunResult("stock", 0.0, 1.0), tmp_path) == ("stock", {}, [])
    recorded["prefill_profile"] = "nowhere/q.yaml"
    _, sim_settings, notes = sim_policy(run, tmp_path)
    assert "PREFILL_PROFILE" not in sim_settings and any("is gone" in n for n in notes)
    with pytest.raises(SystemExit, match="run compare again"):
        sim_policy(RunResult("old", 0.0, 1.0, meta={"continuum_settings": {"a": 1}}), tmp_path)
