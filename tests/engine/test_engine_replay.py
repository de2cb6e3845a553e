"""A short live replay (`bench`) on the session's stock and continuum servers."""

from __future__ import annotations

import pytest

from continuum_lab.results import RunResult
from continuum_lab.trace_format import Program, Trace, Turn


@pytest.mark.engine
def test_live_replay(live_servers, tmp_path):
    """`bench` on two short programs and a one-shot request against stock vLLM and
    continuum: prompts grow by the generated tokens and the new tokens, resumed
    turns hit the cache, the one-shot request (no session) is served and reported
    apart, and the report (JSON, table, plots) is written."""
    import json

    from continuum_lab.live.compare import run_bench

    trace = Trace([
        Program("a", 0.0, (Turn(300, 8, "grep", 0.2), Turn(64, 8, "cat", 0.1), Turn(64, 4))),
        Program("b", 0.1, (Turn(250, 8, "python", 0.3), Turn(64, 4))),
        Program("c", 0.2, (Turn(200, 4),), one_shot=True),
    ], {"seed": 0})
    path = trace.save(tmp_path / "trace.jsonl")
    for flavour, server in live_servers.items():
        out = tmp_path / flavour
        assert run_bench(server.base_url, str(path), out, label=flavour) == 0
        data = json.loads((out / "results.json").read_text())
        assert (out / "table.md").is_file() and (out / "plots" / "jct_cdf.png").is_file()
        run = RunResult.from_json(data["runs"][0])
        assert len(run.programs) == 2 and len(run.turns) == 5
        (c,) = run.one_shot
        assert (c.program, c.prompt_tokens, c.output_tokens) == ("c", 200, 4) and c.ttft_s > 0
        assert data["summaries"][0]["one_shot_requests"] == 1
        assert (out / "plots" / "one_shot_ttft_cdf.png").is_file()
        by_key = {(t.program, t.turn): t for t in run.turns}
        a0, a1, a2 = (by_key[("a", k)] for k in range(3))
        assert a0.prompt_tokens == 300 and a0.output_tokens == 8
        assert a1.prompt_tokens == 300 + 8 + 64 and a1.prev_prompt_tokens == 300
        assert a2.prompt_tokens == a1.prompt_tokens + 8 + 64
        # Nothing evicts these small sessions: both servers find the history cached.
        for t in run.turns:
            if t.turn:
                assert t.cached_tokens >= t.prev_prompt_tokens // 32 * 32, (flavour, t)
        assert all(p.jct_s > 0.2 for p in run.programs)
