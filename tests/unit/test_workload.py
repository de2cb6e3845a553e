"""Workload generation and the trace format (no vLLM engine; fast)."""

from __future__ import annotations

import json

import pytest

from continuum_lab.configs import WORKLOAD_DIR
from continuum_lab.trace_format import FORMAT, Program, Trace, Turn
from continuum_lab.workload_spec import load_spec, load_trace

PAPER_WORKLOADS = ["swebench", "bfcl"]


@pytest.mark.parametrize("name", PAPER_WORKLOADS)
def test_tool_mixture_matches_table2(name):
    """The spec's tool mix has Table 2's mean and std (exactly, before sampling)."""
    spec = load_spec(name)
    mean, std = spec.tool_mixture()
    assert mean == pytest.approx(spec.paper["tool_s_mean"], rel=0.02)
    assert std == pytest.approx(spec.paper["tool_s_std"], rel=0.03)
    assert len(spec.tools) >= 3
    assert len({t.duration_s.mean for t in spec.tools}) >= 3  # different profiles


@pytest.mark.parametrize("name", PAPER_WORKLOADS)
def test_generated_statistics_match_table2(name):
    spec = load_spec(name)
    trace = spec.with_overrides(num_programs=1500, seed=7).generate()
    s = trace.summary()
    paper = spec.paper
    assert s["turns_mean"] == pytest.approx(paper["turns_mean"], rel=0.05)
    assert s["turns_std"] == pytest.approx(paper["turns_std"], rel=0.15)
    assert s["tokens_mean"] == pytest.approx(paper["tokens_mean"], rel=0.05)
    assert s["tokens_std"] == pytest.approx(paper["tokens_std"], rel=0.2)
    assert s["tool_s_mean"] == pytest.approx(paper["tool_s_mean"], rel=0.1)
    assert s["tool_s_std"] == pytest.approx(paper["tool_s_std"], rel=0.25)
    # Long-tailed: the median call is much shorter than the mean.
    assert s["tool_s_p50"] < 0.8 * s["tool_s_mean"]
    assert s["arrival_rate"] == pytest.approx(spec.arrival_rate, rel=0.1)
    assert s["final_context_max"] <= spec.max_context_tokens


def test_every_shipped_workload_loads():
    names = sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))
    assert {"swebench", "bfcl", "cpu-agent"} <= set(names)
    for name in names:
        trace = load_spec(name).with_overrides(num_programs=5).generate()
        assert len(trace.agents) == 5


def test_generation_is_seeded_and_prefix_stable():
    spec = load_spec("swebench")
    a = spec.with_overrides(num_programs=20, seed=3).generate()
    b = spec.with_overrides(num_programs=20, seed=3).generate()
    c = spec.with_overrides(num_programs=30, seed=3).generate()
    d = spec.with_overrides(num_programs=20, seed=4).generate()
    assert [p.to_json() for p in a] == [p.to_json() for p in b]
    assert [p.to_json() for p in a] == [p.to_json() for p in c][:20]  # a longer run extends
    assert [p.to_json() for p in a] != [p.to_json() for p in d]


def test_turn_structure():
    for program in load_spec("bfcl").with_overrides(num_programs=50).generate():
        assert program.turns[-1].tool is None and program.turns[-1].tool_s == 0
        assert all(t.tool is not None for t in program.turns[:-1])
        lengths = program.prompt_lengths
        assert lengths == sorted(lengths)  # the history only grows
        assert all(program.prompt_tokens(k) == n for k, n in enumerate(lengths))


MIXED_SPECS = [("mixed", "swebench-final-context"), ("cpu-mixed", "cpu-agent")]


@pytest.mark.parametrize("name, base", MIXED_SPECS)
def test_mixed_spec_keeps_its_base_agents(name, base):
    """A mixed spec's agents are its base spec's, drawn identically (only the id
    prefix differs): the one-shot requests come from streams of their own."""
    mixed, agents = load_spec(name), load_spec(base)
    assert mixed.one_shot is not None and agents.one_shot is None
    for seed in (0, 3):
        a = mixed.with_overrides(num_programs=15, seed=seed).generate()
        b = agents.with_overrides(num_programs=15, seed=seed, arrival_rate=mixed.arrival_rate).generate()
        assert [(p.arrival_s, p.turns) for p in a.agents] == [(p.arrival_s, p.turns) for p in b]
        assert a.one_shots and not b.one_shots


@pytest.mark.parametrize("name", ["swebench", "bfcl", "cpu-agent", "swebench-final-context"])
def test_one_shot_traffic_leaves_agent_traces_unchanged(name):
    """Adding chat traffic to a spec changes none of its programs; a spec without
    it writes exactly the lines it wrote before the one-shot field existed."""
    spec = load_spec(name).with_overrides(num_programs=12, seed=2)
    plain = spec.generate()
    chat = spec.with_overrides(one_shot={"arrival_rate": 0.5, "prompt_tokens": {"mean": 100, "std": 50},
                                         "output_tokens": {"mean": 20, "std": 5}}).generate()
    assert [p.to_json() for p in chat.agents] == [p.to_json() for p in plain]
    assert all("one_shot" not in p.to_json() for p in plain)
    assert "one_shot_rate" not in plain.meta and "one_shot_requests" not in plain.summary()


def test_mixed_spec_draws_one_shot_counts_rates_and_sizes():
    """Over a long run the one-shot stream has the spec's rate and size
    distributions, arrives only while agents arrive, and is one tool-less turn each."""
    spec = load_spec("mixed").with_overrides(num_programs=300, seed=5)
    trace = spec.generate()
    agents, chat = trace.agents, trace.one_shots
    window = agents[-1].arrival_s
    assert len(agents) == 300
    assert all(0 < p.arrival_s <= window for p in chat)
    assert all(len(p.turns) == 1 and p.turns[0].tool is None for p in chat)
    expected = spec.one_shot.arrival_rate * window  # Poisson: std = sqrt(expected)
    assert abs(len(chat) - expected) < 4 * expected**0.5
    s = trace.summary()
    assert s["one_shot_requests"] == len(chat) == trace.meta["one_shot_requests"]
    assert s["one_shot_rate"] == pytest.approx(spec.one_shot.arrival_rate, rel=0.1)
    assert s["one_shot_prompt_mean"] == pytest.approx(spec.one_shot.prompt_tokens.mean, rel=0.1)
    assert s["one_shot_prompt_std"] == pytest.approx(spec.one_shot.prompt_tokens.std, rel=0.25)
    assert s["one_shot_output_mean"] == pytest.approx(spec.one_shot.output_tokens.mean, rel=0.1)
    sizes = [p.turns[0].new_tokens for p in chat]
    assert spec.one_shot.prompt_tokens.min <= min(sizes) and max(sizes) <= spec.one_shot.prompt_tokens.max
    assert s["programs"] == 300 and s["arrival_rate"] == pytest.approx(spec.arrival_rate, rel=0.15)
    assert len({p.id for p in trace}) == len(trace)


def test_mixed_trace_round_trip_and_head(tmp_path):
    """One-shot requests keep their flag through a file; cutting a saved trace to n
    programs keeps the one-shot requests a spec generates for n programs."""
    spec = load_spec("cpu-mixed").with_overrides(seed=4)
    trace = spec.generate()
    path = trace.save(tmp_path / "mixed.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert [line.get("one_shot", False) for line in lines] == [p.one_shot for p in trace]
    back = Trace.load(path)
    assert [p.to_json() for p in back] == [p.to_json() for p in trace]
    short = spec.with_overrides(num_programs=5).generate()
    assert [p.to_json() for p in load_trace(path, num_programs=5)] == [p.to_json() for p in short]
    assert 0 < len(short.one_shots) < len(trace.one_shots)


def test_one_shot_program_is_one_turn_without_tool():
    assert Program("c", 1.0, (Turn(100, 10),), one_shot=True).one_shot
    with pytest.raises(ValueError, match="one-shot"):
        Program("c", 1.0, (Turn(100, 10, "grep", 0.5), Turn(10, 5)), one_shot=True)
    with pytest.raises(ValueError, match="t.jsonl:1"):
        Trace.parse(['{"id": "c", "arrival_s": 0, "one_shot": true, "turns": ['
                     '{"new_tokens": 9, "output_tokens": 1, "tool": "ls", "tool_s": 1}]}'], source="t.jsonl")


def test_trace_round_trip(tmp_path):
    trace = load_spec("swebench").with_overrides(num_programs=10).generate()
    path = trace.save(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == FORMAT
    back = Trace.load(path)
    assert [p.to_json() for p in back] == [p.to_json() for p in trace]
    assert back.meta["workload"] == "swebench"
    assert len(load_trace(path, num_programs=4)) == 4


def test_trace_without_header_and_bad_lines(tmp_path):
    program = Program("x", 1.5, (Turn(100, 10, "grep", 0.5), Turn(20, 5)))
    trace = Trace.parse([json.dumps(program.to_json())])
    assert trace.programs[0] == program
    assert program.prompt_lengths == [100, 130]
    assert program.total_prompt_tokens == 230
    with pytest.raises(ValueError, match="t.jsonl:2"):
        Trace.parse(['{"format": "vllm-continuum-trace/1"}', '{"id": "y"}'], source="t.jsonl")
    with pytest.raises(ValueError, match="unsupported format"):
        Trace.parse(['{"format": "other/9"}'])


def test_convert_chat_transcripts(tmp_path):
    from continuum_lab.transcripts import convert

    traj = {  # the shape of a mini-swe-agent trajectory
        "info": {"exit_status": "Submitted"},
        "messages": [
            {"role": "system", "content": "s" * 400},
            {"role": "user", "content": "u" * 800},
            {"role": "assistant", "content": "THOUGHT\n```bash\ngrep -rn foo src/\n```",
             "timestamp": 100.0},
            {"role": "user", "content": "o" * 200, "timestamp": 101.5},
            {"role": "assistant", "content": None, "timestamp": 103.0, "tool_calls": [
                {"type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]},
            {"role": "tool", "content": "ok", "timestamp": 109.0},
            {"role": "assistant", "content": "done", "timestamp": 110.0},
        ],
    }
    (tmp_path / "a.traj.json").write_text(json.dumps(traj))
    untimed = [{k: v for k, v in m.items() if k != "timestamp"} for m in traj["messages"][:5]]
    (tmp_path / "b.jsonl").write_text(json.dumps(untimed) + "\n")
    trace = convert([tmp_path], tmp_path / "out.jsonl", rate=0.5, seed=1)
    a = next(p for p in trace if p.id == "a")
    assert [t.tool for t in a.turns] == ["grep", "run_tests", None]
    assert [t.tool_s for t in a.turns] == [1.5, 6.0, 0.0]
    assert a.turns[0].new_tokens == 300 and a.turns[1].new_tokens == 50
    b = next(p for p in trace if p.id == "b-0")
    assert [t.tool for t in b.turns] == ["grep", None]
    assert b.turns[0].tool_s > 0  # drawn from swebench's grep profile
    assert Trace.load(tmp_path / "out.jsonl").meta["tool_durations"].startswith("drawn")
