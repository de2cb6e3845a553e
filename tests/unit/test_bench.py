"""The replay client, reports and plots (the live replay: tests/engine/test_engine_replay.py)."""

from __future__ import annotations

import json

import pytest

from continuum_lab.live.compare import merge_runs, one_shot_line
from continuum_lab.live.round_report import round_outcomes, round_table
from continuum_lab.live.replay import new_tokens
from continuum_lab.report import markdown_table, plot_runs, summarize, write_runs
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.trace_format import Program, Trace, Turn


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


def _with_one_shot(run: RunResult, ttfts: list[float]) -> RunResult:
    """The run plus one-shot requests with these TTFTs (latency: TTFT + 1 s)."""
    run.one_shot += [TurnRecord(f"c{i}", 0, None, float(i), ttft, ttft + 1.0, 50, 0, 4, 0)
                     for i, ttft in enumerate(ttfts)]
    return run


def test_one_shot_columns_from_known_inputs(tmp_path):
    """p50/p99 of the one-shot requests (numpy's linear percentiles), their ratio to
    stock's, and the agents' figures untouched by them."""
    stock = _with_one_shot(_run("stock", 10.0, 32), [1.0, 2.0, 3.0, 4.0, 5.0])
    ours = _with_one_shot(_run("continuum", 5.0, 110), [2.0, 4.0, 6.0, 8.0, 20.0])
    s, o = summarize(stock), summarize(ours)
    assert (s["one_shot_requests"], s["one_shot_ttft_p50_s"]) == (5, 3.0)
    assert s["one_shot_ttft_p99_s"] == pytest.approx(4.96)  # 4 + 0.96 * (5 - 4)
    assert o["one_shot_ttft_p99_s"] == pytest.approx(19.52)  # 8 + 0.96 * (20 - 8)
    assert o["one_shot_latency_p50_s"] == pytest.approx(7.0)
    plain = summarize(_run("continuum", 5.0, 110))
    agent_keys = [k for k in plain if not k.startswith("one_shot")]
    assert {k: o[k] for k in agent_keys} == {k: plain[k] for k in agent_keys}
    assert plain["one_shot_requests"] == 0
    table = markdown_table([s, o], baseline="stock").splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    row = dict(zip(head, (c.strip() for c in table[3].strip("|").split("|"))))
    assert row["one-shot p99 TTFT s"] == "19.520"
    assert row["one-shot p99 TTFT / stock's"] == f"{19.52 / 4.96:.2f}x"
    assert row["one-shot p99 latency / stock's"] == f"{20.52 / 5.96:.2f}x"
    assert row["stock JCT / JCT"] == "2.00x"
    # Without one-shot traffic the table is the agents' table as before.
    assert "one-shot" not in markdown_table([plain], baseline="continuum")
    paths = plot_runs([stock, ours], tmp_path / "plots")
    assert tmp_path / "plots" / "one_shot_ttft_cdf.png" in paths
    back = RunResult.from_json(json.loads(json.dumps(ours.to_json())))
    assert back.one_shot == ours.one_shot
    merged = merge_runs([stock, stock], "stock")
    assert len(merged.one_shot) == 10 and len({t.program for t in merged.one_shot}) == 10
    rounds = round_table([[stock, ours]])
    assert rounds.splitlines()[0].endswith("| one-shot p99 TTFT s | one-shot p99 TTFT / stock's |")
    (row,) = [r for r in rounds.splitlines() if "| continuum |" in r]
    assert row.endswith(f"| 2.00x | 5.0 | 2.00x | 100.0% | 19.520 | {19.52 / 4.96:.2f}x |")
    line = one_shot_line(o, s)
    assert "p50 6.000 s, p99 19.520 s" in line and f"({19.52 / 4.96:.2f}x stock's)" in line


def test_replay_sends_one_shot_requests_without_session(monkeypatch):
    """The replay client's bodies: an agent turn carries its session and hints, a
    one-shot request neither; each is recorded where it belongs."""
    from continuum_lab.live import replay as replay_mod

    bodies = []

    async def served_model(client):
        return "m"

    async def send_turn(client, body, started):
        bodies.append({**body, "prompt": list(body["prompt"])})  # the client grows its history in place
        return 0.01, 0.02, [7] * body["max_tokens"], {"prompt_tokens": len(body["prompt"])}

    monkeypatch.setattr(replay_mod, "_served_model", served_model)
    monkeypatch.setattr(replay_mod, "_send_turn", send_turn)
    trace = Trace([Program("a", 0.0, (Turn(30, 2, "grep", 0.0), Turn(5, 1))),
                   Program("c", 0.0, (Turn(40, 3),), one_shot=True)])
    run = replay_mod.replay("http://unused", trace, progress=False, session_prefix="x-")
    by_prompt = {len(b["prompt"]): b for b in bodies}
    assert by_prompt[30]["session_id"] == "x-a" and by_prompt[30]["vllm_xargs"] == {"continuum_tool": "grep"}
    assert by_prompt[30 + 2 + 5]["vllm_xargs"] == {"continuum_last_turn": 1}
    assert "session_id" not in by_prompt[40] and "vllm_xargs" not in by_prompt[40]
    assert [p.program for p in run.programs] == ["a"] and [t.program for t in run.turns] == ["a", "a"]
    assert [(t.program, t.prompt_tokens, t.output_tokens) for t in run.one_shot] == [("c", 40, 3)]


def test_round_table_gives_each_round_and_the_spread():
    """Two rounds in alternating order: each round's row, and the spread of the
    per-round ratios (range and geometric mean), computed here by hand."""
    rounds = [[_run("stock", 10.0, 32), _run("continuum", 5.0, 110)],
              [_run("continuum", 16.0, 110), _run("stock", 8.0, 32)]]
    lines = round_table(rounds).splitlines()
    # One program per run arriving at 0: its JCT is the makespan.
    assert "| 1 | stock then continuum | continuum | 5.00 | 2.00x | 5.0 | 2.00x | 100.0% |" in lines
    assert "| 2 | continuum then stock | continuum | 16.00 | 0.50x | 16.0 | 0.50x | 100.0% |" in lines
    assert ("continuum: stock / mean JCT by round 0.50x to 2.00x, "
            "geometric mean 1.00x over 2 rounds") in lines
    assert ("continuum: stock / makespan by round 0.50x to 2.00x, "
            "geometric mean 1.00x over 2 rounds") in lines
    assert lines[-1] == ("stock alone (the machine's drift, not signal): mean JCT 8.00-10.00 s "
                         "(max / min 1.25x), makespan 8.0-10.0 s (max / min 1.25x) over 2 rounds")
    outcomes = round_outcomes(rounds)
    assert outcomes.startswith("Round 1. Outcome against stock") and "Round 2." in outcomes
    assert "| continuum | 0% | 0.50x | 0.50x | 2.00x |" in outcomes


def test_new_tokens_are_distinct_and_stable():
    p = Program("a", 0.0, (Turn(10, 2),))
    q = Program("b", 0.0, (Turn(10, 2),))
    assert new_tokens(p, 0, 50, 0) == new_tokens(p, 0, 50, 0)
    assert new_tokens(p, 0, 50, 0) != new_tokens(q, 0, 50, 0)
    assert new_tokens(p, 1, 50, 0) != new_tokens(p, 0, 50, 0)


def test_server_counters_from_a_known_exposition(monkeypatch):
    """What `compare` prints of a continuum server's /metrics: tool calls read (the
    TTL histogram's count by tool), pins, resumes and releases; nothing for stock.
    And what it records of every server's: vLLM's preemptions."""
    import httpx

    from continuum_lab.live import server_counters

    text = "\n".join([
        "# TYPE continuum_ttl_seconds histogram",
        'continuum_ttl_seconds_bucket{model_name="m",tool="grep",le="+Inf"} 3.0',
        'continuum_ttl_seconds_count{model_name="m",tool="grep"} 3.0',
        'continuum_ttl_seconds_sum{model_name="m",tool="grep"} 1.5',
        'continuum_ttl_seconds_count{model_name="m",tool="search"} 2.0',
        'continuum_ttl_seconds_sum{model_name="m",tool="search"} 0.0',
        "# TYPE continuum_pins counter",
        'continuum_pins_total{model_name="m",tool="grep"} 3.0',
        "# TYPE continuum_reloadable_pins counter",
        'continuum_reloadable_pins_total{model_name="m"} 2.0',
        "# TYPE continuum_resumes counter",
        'continuum_resumes_total{model_name="m",outcome="pinned"} 2.0',
        'continuum_resumes_total{model_name="m",outcome="unpinned"} 1.0',
        "# TYPE continuum_pin_releases counter",
        'continuum_pin_releases_total{model_name="m",reason="expired"} 1.0',
        "# TYPE vllm_num_requests_running gauge",
        'vllm_num_requests_running{model_name="m"} 0.0',
        "# TYPE vllm:num_preemptions counter",
        'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0',
        'vllm:num_preemptions_total{engine="1",model_name="m"} 1.0',
        "",
    ])
    pages = {"http://c/metrics": text, "http://s/metrics": text.split("# TYPE continuum_ttl")[0]
             + "# TYPE vllm_num_requests_running gauge\nvllm_num_requests_running 0.0\n"}
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(
        200, text=pages[url], request=httpx.Request("GET", url)))
    counters = server_counters.continuum_counters("http://c/")
    assert counters == {"tool_calls_read": {"grep": 3, "search": 2}, "pins": 3, "reloadable_pins": 2,
                        "resumes": {"pinned": 2, "unpinned": 1}, "releases": {"expired": 1}}
    assert server_counters.counters_line("continuum", counters) == (
        "continuum server: read 5 tool calls (grep 3, search 2), pinned 3 (2 reloadable); "
        "resumed turns: pinned 2, unpinned 1; pin releases: expired 1")
    assert server_counters.continuum_counters("http://s") == {}
    # vLLM's preemptions, over its engines; none from a server that does not export them.
    assert server_counters.engine_preemptions("http://c/") == 5
    assert server_counters.engine_preemptions("http://s") is None


def test_benchmark_servers_leave_the_engine_core_a_core(monkeypatch):
    """compare's and calibrate's servers run the model worker on every core but one
    (vLLM's engine core spins on the other), or on --model-threads."""
    from continuum_lab.live.flavours import bench_server_env, model_threads

    assert [model_threads(n) for n in (1, 2, 8)] == [1, 1, 7]
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert bench_server_env() == {"OMP_NUM_THREADS": "3"}
    assert bench_server_env(2) == {"OMP_NUM_THREADS": "2"}
