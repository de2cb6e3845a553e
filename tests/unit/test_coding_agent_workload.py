"""The long-horizon coding-agent spec has the shape issue 12 asks for."""

from __future__ import annotations

from continuum_lab.workload_spec import load_spec


def test_coding_agent_is_long_horizon_with_bimodal_tool_times():
    spec = load_spec("coding-agent")
    trace = spec.with_overrides(num_programs=200, seed=1).generate()
    turns = [len(p.turns) for p in trace]
    assert 20 <= min(turns) and max(turns) <= 50
    contexts = [p.prompt_lengths[-1] for p in trace]
    assert max(contexts) <= spec.max_context_tokens and sum(contexts) / len(contexts) > 30_000
    calls = [t.tool_s for p in trace for t in p.turns if t.tool is not None]
    fast = sum(d < 1.5 for d in calls) / len(calls)
    slow = sum(5.0 <= d <= 30.0 for d in calls) / len(calls)
    assert fast > 0.7 and 0.12 < slow < 0.3 and fast + slow > 0.97
