"""`vllm-continuum tool-call-bench` and `middleware-bench` at their smallest:
what they measure and report, not their timings (the figures:
docs/benchmarks.md, docs/results/)."""

from __future__ import annotations

import json

from vllm_continuum.cli import main


def test_tool_call_bench_reads_every_case_as_it_should(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    main(["tool-call-bench", "--tokens", "400", "--repeat", "2", "--batches", "2", "--no-tekken",
          "--model-dir", tiny_model_dir, "--work", str(tmp_path / "work"), "--out", str(out)])
    rows = {(r["tokenizer"], r["case"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows[("tiny (hermes)", "call")]["found"] == ["get_weather", "hermes"]
    assert rows[("tiny (hermes)", "call")]["found_before"] == "get_weather"
    assert rows[("tiny (kimi_k2)", "call")]["found"] == ["get_weather", "kimi_k2"]
    assert rows[("tiny (kimi_k2)", "call")]["found_before"] == "unknown"  # the token, not the name
    assert rows[("tiny (hermes)", "spelled call")]["found"] == ["get_weather", "hermes"]
    assert rows[("tiny (hermes)", "spelled call")]["found_before"] is None
    for key, row in rows.items():
        assert row["tokens"] == 400, key
        assert 0 < row["new"]["min_us"] <= row["new"]["p50_us"], key
        if "answer" in key[1]:
            assert row["found"] is None and row["found_before"] is None, key
        assert row["verdict"] == ("PASS" if row["new_over_before"] <= 1.10 else "FAIL")
    printed = capsys.readouterr().out
    assert "| tiny (kimi_k2) | call (400 tokens) |" in printed
    assert "reproduce: vllm-continuum tool-call-bench" in printed


def test_middleware_bench_times_a_claude_code_body_and_its_grown_conversation(tmp_path, capsys):
    out = tmp_path / "report.json"
    main(["middleware-bench", "--repeat", "1", "--batches", "1", "--out", str(out)])
    small, large = json.loads(out.read_text())["rows"]
    assert 70_000 < small["body_bytes"] < 90_000 and large["body_bytes"] >= 1_800_000
    for row in (small, large):
        share = row["add_hints"]["p50_us"] / row["parse"]["p50_us"]
        assert row["add_hints_over_parse"] == round(share, 4)
        assert row["verdict"] == ("PASS" if share < 0.1 else "FAIL")
    assert "reproduce: vllm-continuum middleware-bench" in capsys.readouterr().out
