"""What `compare` records of each round: the trace as sent, read back from the
replay's records (live/sent_trace.py), and the round store (live/rounds.py)."""

from __future__ import annotations

import pytest

from continuum_lab.live.rounds import load_rounds, save_round
from continuum_lab.live.sent_trace import sent_trace
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.trace_format import Program, Trace, Turn

PLANNED = Trace([
    Program("a", 0.0, (Turn(100, 8, "grep", 1.0), Turn(20, 8, "cat", 0.5), Turn(10, 4))),
    Program("b", 2.0, (Turn(50, 8, "grep", 1.0), Turn(30, 4))),
    Program("c", 1.0, (Turn(40, 3),), one_shot=True),
], {"workload": "hand-made"})


def _replayed() -> RunResult:
    """A by-hand replay of PLANNED: 'a' sent late and generated 20 tokens for its
    tool call (no hints), its pauses stretched; 'b' failed after its first turn."""
    run = RunResult("stock", 0.0, 30.0, meta={"round": 2})
    run.turns = [
        # program, turn, tool, sent, ttft, latency, prompt, cached, output, prev prompt
        TurnRecord("a", 0, "grep", 0.25, 0.5, 2.0, 100, 0, 20, 0),
        TurnRecord("a", 1, "cat", 3.5, 0.1, 1.0, 140, 96, 8, 100),  # 100 + 20 + 20 new
        TurnRecord("a", 2, None, 5.25, 0.1, 0.5, 158, 128, 4, 140),  # 140 + 8 + 10
        TurnRecord("b", 0, "grep", 2.0, 0.3, 1.0, 50, 0, 8, 0),
    ]
    run.one_shot = [TurnRecord("c", 0, None, 1.5, 0.2, 0.4, 40, 0, 3, 0)]
    run.programs = [ProgramRecord("a", 0.25, 5.75, 3)]
    return run


def test_sent_trace_is_what_reached_the_server():
    sent = sent_trace(_replayed(), PLANNED)
    assert [p.id for p in sent] == ["a", "c"] and sent.meta["programs_left_out"] == ["b"]
    a = sent.programs[0]
    assert a.arrival_s == 0.25
    assert [t.new_tokens for t in a.turns] == [100, 20, 10]
    assert [t.output_tokens for t in a.turns] == [20, 8, 4]
    assert [t.tool for t in a.turns] == ["grep", "cat", None]
    # pause = next send - (send + latency): 3.5 - 2.25, 5.25 - 4.5
    assert [t.tool_s for t in a.turns] == pytest.approx([1.25, 0.75, 0.0])
    # The simulator's history then reproduces every recorded prompt.
    assert a.prompt_lengths == [100, 140, 158]
    (c,) = sent.one_shots
    assert (c.arrival_s, c.turns[0].new_tokens, c.turns[0].output_tokens) == (1.5, 40, 3)
    assert sent.meta["workload"] == "hand-made" and sent.meta["round"] == 2


def test_rounds_are_saved_and_read_back(tmp_path):
    run = _replayed()
    run.meta["continuum_settings"] = {"ttl_policy": "never"}
    where = save_round(run, PLANNED, tmp_path)
    assert where.name == "r2-stock"
    (record,) = load_rounds(tmp_path)
    assert record.round == 2 and record.label == "stock"
    assert record.run.turns == run.turns and record.run.meta["continuum_settings"] == {"ttl_policy": "never"}
    assert [p.id for p in record.sent] == ["a", "c"]
    with pytest.raises(FileNotFoundError, match="not a `compare` output directory"):
        load_rounds(tmp_path / "nothing")
    # A stray file is not a replay; a replay saved halfway is named, with the fix.
    (where.parent / "notes.txt").write_text("")
    assert len(load_rounds(tmp_path)) == 1
    (where / "sent-trace.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="r2-stock lacks .* remove that directory"):
        load_rounds(tmp_path)
