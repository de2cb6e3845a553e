"""`vllm-continuum sizing`: is a live workload where pinning can pay?

Two numbers decide it for a batch of agent programs on one server, and a
workload spec for the live benchmark states both:

- **re-prefill against decode**: what a resumed turn loses when its history
  was evicted (prefilling the history again: the cold prefill of its whole
  prompt minus the prefill of its new tokens on the cached history) against
  what it spends decoding its output (output tokens x one decode step at its
  context, alone, and beside `--batch` others). Where the re-prefill is the
  smaller, keeping the history saves less than the turn's own decode;
- **pool against contexts**: the KV pool over the sum of the programs' final
  contexts (a third: the pool holds a third of what the batch builds up).

Both are read from a cost model (`calibrate` on that server), on the trace
the spec generates, so the figures in a spec's header can be checked with
one command.
"""

from __future__ import annotations

import statistics

from continuum_lab.sim.cost_model import CostModel
from continuum_lab.trace_format import Trace


def resumed_turn_costs(trace: Trace, cost: CostModel, batch: int) -> list[dict]:
    """Per resumed agent turn: its re-prefill, and its decode alone and in a batch."""
    rows = []
    for p in trace.agents:
        prompts = p.prompt_lengths
        for k in range(1, len(p.turns)):
            turn, history = p.turns[k], prompts[k] - p.turns[k].new_tokens
            reprefill = cost.prefill_seconds(prompts[k]) - cost.prefill_seconds(turn.new_tokens, history)
            steps = [prompts[k] + i for i in range(turn.output_tokens)]
            alone = sum(cost.step_time([(1, c)]) for c in steps)
            batched = sum(cost.step_time([(1, c)] * batch) for c in steps)
            rows.append({"program": p.id, "turn": k, "context": prompts[k], "reprefill_s": reprefill,
                         "decode_alone_s": alone, "decode_batched_s": batched})
    return rows


def sizing_report(trace: Trace, cost: CostModel, batch: int) -> str:
    """The two numbers, with the medians and ranges behind them, and the cost model read."""
    finals = [p.final_context_tokens for p in trace.agents]
    rows = resumed_turn_costs(trace, cost, batch)
    if not rows:
        raise SystemExit("the trace has no resumed turns (programs of one turn): nothing to size")
    alone = [r["reprefill_s"] / r["decode_alone_s"] for r in rows]
    batched = [r["reprefill_s"] / r["decode_batched_s"] for r in rows]
    pool = cost.pool_tokens
    return "\n".join([
        f"{len(trace.agents)} programs, final contexts {min(finals)}-{max(finals)} tokens "
        f"(sum {sum(finals)}); KV pool {pool} tokens ({pool // cost.block_size} blocks of {cost.block_size}): "
        f"the pool holds {pool / sum(finals):.2f} of the final contexts",
        f"{len(rows)} resumed turns, contexts {min(r['context'] for r in rows)}-"
        f"{max(r['context'] for r in rows)} tokens: re-prefill "
        f"{statistics.median(r['reprefill_s'] for r in rows):.3f} s median, decode alone "
        f"{statistics.median(r['decode_alone_s'] for r in rows):.3f} s, beside {batch - 1} others "
        f"{statistics.median(r['decode_batched_s'] for r in rows):.3f} s",
        f"re-prefill / decode: alone {statistics.median(alone):.2f}x median (min {min(alone):.2f}x, "
        f"{sum(x >= 1 for x in alone) / len(alone):.0%} of turns >= 1); beside {batch - 1} others "
        f"{statistics.median(batched):.2f}x (min {min(batched):.2f}x, "
        f"{sum(x >= 1 for x in batched) / len(batched):.0%} >= 1)",
        f"cost model {cost.name}" + (f": {cost.headline}" if cost.headline else ""),
    ])
