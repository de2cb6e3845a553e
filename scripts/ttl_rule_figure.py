"""Draws docs/img/hazard-ttl.png: what `ttl_policy: hazard` decides over
a pause, for a fast tool and a slow one, on a quiet pool and a contested one.

The durations are drawn from the slow-tool workloads' own specs (browse-agent's
`browse` and `view`, ci-agent's `ci`), 200 calls each, recorded into the
rule's workload model as a server would record them; the benefit is the
reload of a 40k-token context under the default profile (an 8B model on an
H100-class GPU: about 4.8 s) plus a measured queueing delay T of 5 s.

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
from vllm_continuum.experiments.workload_spec import load_spec

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "hazard-ttl.png"
TOKENS = 40_000


def main() -> None:
    rng = np.random.default_rng(0)
    workload = WorkloadModel(history_limit=1000, queueing_window=16, program_window=16)
    specs = {"view": "browse-agent", "browse": "browse-agent", "ci": "ci-agent"}
    for tool, spec_name in specs.items():
        spec = next(t for t in load_spec(spec_name).tools if t.name == tool)
        for d in spec.duration_s.sample(rng, 200):
            workload.durations.add(tool, float(d))
    workload.queueing.add(5.0)
    policy = HazardTTLPolicy(workload, PrefillProfile(), max_ttl_s=30.0, revisit_s=1e9)
    elapsed = np.linspace(0, 30, 301)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (label, contention) in zip(axes, (("quiet pool (nobody entitled waits)", 0.0),
                                              ("contested pool (one-shots need the blocks)", 1.0))):
        for tool, colour in (("view", "tab:green"), ("browse", "tab:blue"), ("ci", "tab:red")):
            until = []
            for a in elapsed:
                more = policy.revisit(tool, float(a), TOKENS, contention)
                until.append(a + more if more > 0 else np.nan)
            ax.plot(elapsed, until, color=colour, label=f"{tool}: held until")
            released = elapsed[np.isnan(until)]
            if len(released):
                ax.scatter(released[:1], released[:1], color=colour, marker="x", s=60, zorder=3,
                           label=f"{tool}: released at {released[0]:.1f} s")
        ax.plot([0, 30], [0, 30], color="grey", lw=0.5, ls=":")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("time the call has run so far (s)")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("horizon the pin is held to (s)\n(blank: released)")
    fig.suptitle("ttl_policy: hazard, decided again as the call runs (max_ttl_s 30)", fontsize=11)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
