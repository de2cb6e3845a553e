"""Draws docs/img/hazard-ttl.png: what `ttl_policy: hazard` decides over
a pause, for a fast tool, a mostly-returning slow one and one slower than
the cap.

The durations are drawn from the slow-tool workloads' own specs (browse-agent's
`browse` and `view`, ci-agent's `ci`), 200 calls each, recorded into the
rule's workload model as a server would record them; the benefit is the
reload of a 40k-token context under the default profile (an 8B model on an
H100-class GPU: about 4.8 s) plus a measured queueing delay T of 5 s; the
pool contested (an allocation has just failed), so the memory has its price.

    PYTHONPATH=. python scripts/ttl_rule_figure.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.workload import WorkloadModel
from continuum_lab.workload_spec import load_spec

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "hazard-ttl.png"
TOKENS = 40_000


def main() -> None:
    rng = np.random.default_rng(0)
    workload = WorkloadModel(history_limit=1000, queueing_window=16, program_window=16)
    specs = {"view": "browse-agent", "browse": "browse-agent", "ci": "ci-agent"}
    for tool, spec_name in specs.items():
        spec = next(t for t in load_spec(spec_name).tools if t.name == tool)
        for d in spec.duration_s.sample(rng, 200):
            workload.tools.of(None).durations.add(tool, float(d))
    workload.queueing.add(5.0)
    workload.blocks_short(0.0)  # the pool contested: memory has its price (else it is free)
    policy = HazardTTLPolicy(workload, PrefillProfile(), max_ttl_s=30.0)  # revisits every 5 s
    tools = (("view", "tab:green"), ("browse", "tab:blue"), ("ci", "tab:red"))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), height_ratios=(1, 1.1))
    # Top: what the rule conditions on, P(the call returns within the rest of
    # the cap | it has run a seconds), from the mixture the rule reads.
    elapsed = np.linspace(0, 30, 301)
    for tool, colour in tools:
        parts = policy.parts(tool)
        p = []
        for a in elapsed:
            alive = sum(w * (sum(1 for x in s if x > a) + k) / (len(s) + k) for w, s, k in parts if s or k)
            back = sum(w * sum(1 for x in s if a < x <= 30) / (len(s) + k) for w, s, k in parts if s or k)
            p.append(back / alive if alive > 0 else 0.0)
        top.plot(elapsed, p, color=colour, label=tool)
    top.set_ylabel("P(returns by 30 s |\nstill running at t)")
    top.set_xlim(0, 31)
    top.legend(fontsize=8)
    top.set_title("what the rule conditions on", fontsize=10)
    # Bottom: a pin of a call that has not returned, followed from the turn's
    # end: each bar is one TTL the rule gave (a decision), x where it let go.
    rows = [(tool, colour) for tool, colour in tools]
    for y, (tool, colour) in enumerate(rows):
        t = 0.0
        while True:
            more = policy.revisit(tool, t, TOKENS)
            if more <= 0:
                break
            bottom.barh(y, more, left=t, color=colour, alpha=0.6, edgecolor="black", linewidth=0.6)
            t += more
        bottom.scatter([t], [y], marker="x", color="black", zorder=3)
        bottom.text(t + 0.4, y, f"released at {t:.1f} s", va="center", fontsize=7)
    bottom.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    bottom.invert_yaxis()
    bottom.set_xlim(0, 36)
    bottom.set_xlabel("seconds since the turn ended (the call has not returned)")
    bottom.set_title("the pin's TTLs, one bar per decision (each revisit at most 5 s ahead)",
                     fontsize=9)
    fig.suptitle("ttl_policy: hazard, max_ttl_s 30: a fast tool (view), a mostly-returning slow one "
                 "(browse), one that never returns in time (ci)", fontsize=9)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
