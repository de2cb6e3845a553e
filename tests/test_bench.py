"""The replay client, reports and plots; a short live replay on the session's servers."""

from __future__ import annotations

import pytest

from vllm_continuum.bench.compare import merge_runs, round_table
from vllm_continuum.bench.replay import ProgramRecord, RunResult, TurnRecord, new_tokens
from vllm_continuum.bench.report import markdown_table, plot_runs, summarize, write_runs
from vllm_continuum.bench.trace import Program, Trace, Turn


def _run(label: str, jct: float, cached: int) -> RunResult:
    run = RunResult(label=label, started_at=0.0, duration_s=jct)
    run.programs.append(ProgramRecord("p", 0.0, jct, 2))
    run.turns += [
        TurnRecord("p", 0, "grep", 0.0, 0.1, 1.0, 100, 0, 10, 0),
        TurnRecord("p", 1, None, 2.0, 0.2, 1.0, 150, cached, 5, 100),
    ]
    return run


def test_summary_and_table(tmp_path):
    stock, ours = _run("stock", 10.0, 32), _run("continuum", 5.0, 110)
    s = summarize(stock)
    assert s["reuse_of_prev_prompt"] == pytest.approx(0.32)
    assert s["prefix_hit_ratio"] == pytest.approx(32 / 250)
    assert summarize(ours)["reuse_of_prev_prompt"] == 1.0  # capped at the previous prompt
    table = markdown_table([summarize(stock), summarize(ours)], baseline="stock")
    assert "2.00x" in table and table.count("\n") == 3
    paths = plot_runs([stock, ours], tmp_path / "plots")
    assert all(p.stat().st_size > 1000 for p in paths)
    assert write_runs([stock, ours], tmp_path).is_file()
    merged = merge_runs([stock, stock], "stock")
    assert len(merged.programs) == 2 and len({p.program for p in merged.programs}) == 2
    assert "| 1 |" in round_table([[stock, ours]])


def test_new_tokens_are_distinct_and_stable():
    p = Program("a", 0.0, (Turn(10, 2),))
    q = Program("b", 0.0, (Turn(10, 2),))
    assert new_tokens(p, 0, 50, 0) == new_tokens(p, 0, 50, 0)
    assert new_tokens(p, 0, 50, 0) != new_tokens(q, 0, 50, 0)
    assert new_tokens(p, 1, 50, 0) != new_tokens(p, 0, 50, 0)


@pytest.mark.engine
def test_live_replay(live_servers, tmp_path):
    """`bench` on two short programs against stock vLLM and continuum: prompts
    grow by the generated tokens and the new tokens, resumed turns hit the
    cache, and the report (JSON, table, plots) is written."""
    import json

    from vllm_continuum.bench.compare import run_bench

    trace = Trace([
        Program("a", 0.0, (Turn(300, 8, "grep", 0.2), Turn(64, 8, "cat", 0.1), Turn(64, 4))),
        Program("b", 0.1, (Turn(250, 8, "python", 0.3), Turn(64, 4))),
    ], {"seed": 0})
    path = trace.save(tmp_path / "trace.jsonl")
    for flavour, server in live_servers.items():
        out = tmp_path / flavour
        assert run_bench(server.base_url, str(path), out, label=flavour) == 0
        data = json.loads((out / "results.json").read_text())
        assert (out / "table.md").is_file() and (out / "plots" / "jct_cdf.png").is_file()
        run = RunResult.from_json(data["runs"][0])
        assert len(run.programs) == 2 and len(run.turns) == 5
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
