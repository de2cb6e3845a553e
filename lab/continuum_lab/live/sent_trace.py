"""The trace a replay actually sent, read back from what it recorded.

A generated trace says what a replay should send; what reached the server
differs: arrivals and tool pauses stretch with the client's own scheduling,
and without client hints (`--hints none`) a tool turn's output is the call
the engine wrote, not the trace's length. To set a simulation beside a live
run (`vllm-continuum predict`), the simulator must replay what was sent, so
`compare` writes each round's and flavour's sent trace, in the trace format
(trace_format.py), beside its records:

- a program's arrival: its first turn's send time (from the replay's start);
- a turn's `new_tokens`: its prompt minus the previous prompt and the
  previous output (the replay's history grows by exactly those);
- `output_tokens`: what the server generated;
- `tool_s`: from the end of the turn's stream to the next turn's send (the
  tool's sleep plus the client's own delay), as the simulator times a pause
  (from the end of the turn);
- the tool names and the one-shot flags: the generated trace's.

A program that failed (fewer turns recorded than it has) is left out and
counted in the header (`programs_left_out`).
"""

from __future__ import annotations

from collections import defaultdict

from continuum_lab.results import RunResult, TurnRecord
from continuum_lab.trace_format import Program, Trace, Turn


def _sent_program(program: Program, records: list[TurnRecord]) -> Program:
    """`program` as sent, from its turns' records (all of them, in turn order)."""
    turns, prev_prompt, prev_output = [], 0, 0
    for k, (planned, rec) in enumerate(zip(program.turns, records)):
        nxt = records[k + 1] if k + 1 < len(records) else None
        pause = max(0.0, nxt.sent_s - (rec.sent_s + rec.latency_s)) if nxt else 0.0
        turns.append(Turn(new_tokens=rec.prompt_tokens - prev_prompt - prev_output,
                          # A simulated request generates at least one token (max_tokens >= 1).
                          output_tokens=max(1, rec.output_tokens),
                          # The trace format: a program's last turn calls no tool.
                          tool=planned.tool if nxt else None, tool_s=pause))
        prev_prompt, prev_output = rec.prompt_tokens, rec.output_tokens
    return Program(program.id, records[0].sent_s, tuple(turns), one_shot=program.one_shot,
                   session=program.session)


def sent_trace(run: RunResult, planned: Trace) -> Trace:
    """`planned`, as `run` (a replay of it) sent it."""
    records: dict[str, list[TurnRecord]] = defaultdict(list)
    for rec in [*run.turns, *run.one_shot]:
        records[rec.program].append(rec)
    programs, left_out = [], []
    for program in planned:
        mine = sorted(records.get(program.id, []), key=lambda r: r.turn)
        if len(mine) != len(program.turns):
            left_out.append(program.id)
            continue
        programs.append(_sent_program(program, mine))
    programs.sort(key=lambda p: (p.arrival_s, p.id))
    meta = {**planned.meta, "sent_by": run.label, "round": run.meta.get("round"),
            "programs_left_out": left_out}
    return Trace(programs, meta)
