"""Fit the linear cost model on the steps a live server ran, instead of on
calibrate's probes: every step `compare --step-log` logged in the chosen
rounds (inside each replay's window) is one point, (new tokens, computed
tokens) per request and the time from schedule() to the end of
update_from_output(). The pool, window and API overhead are kept from
--base. Predict the *other* rounds with it, so the fit never sees what it
predicts:

    .venv/bin/python scripts/fit_steps.py runs/steps-overload --rounds 1 \\
        --base cpu-bench-2l-noon --out runs/cpu-steps-r1.yaml
    vllm-continuum predict runs/steps-overload --cost-model runs/cpu-steps-r1.yaml

Why (docs/benchmarks.md, "Mixed steps, preemptions, and every step the
server ran"): live, the decode-only steps took 1.22-1.93x what the
calibrated model says, the steps with a prefill about what it says. Measured
there: fitted on round 1's steps, this model predicted no better.
"""
import argparse
from pathlib import Path

import yaml

from continuum_lab.calibration.fit import fit_points
from continuum_lab.calibration.probes import Point
from continuum_lab.live.rounds import load_rounds
from continuum_lab.prediction.step_speed import replay_steps
from continuum_lab.sim.cost_model import load_cost_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rounds", type=int, nargs="+", required=True, help="the rounds to fit on")
    p.add_argument("--base", required=True, help="the cost model whose shape and API overhead to keep")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    points, replays = [], []
    for rec in load_rounds(args.run_dir):
        if rec.round in args.rounds and (steps := replay_steps(rec.run.meta, args.run_dir)):
            replays.append(f"r{rec.round}-{rec.label}")
            points += [Point("step", {}, [[tuple(r) for r in s["batch"]]], s["step_s"], False, {})
                       for s in steps]
    if not points:
        raise SystemExit(f"no logged steps in rounds {args.rounds} of {args.run_dir}: "
                         "was it run with `compare --step-log`?")
    fit = fit_points(points)
    base = load_cost_model(args.base)
    data = base.model_dump() | {
        "name": args.out.stem,
        "description": (f"Fitted by scripts/fit_steps.py on {len(points)} engine steps of {args.run_dir} "
                        f"({', '.join(replays)}); shape and API overhead from {base.name}. "
                        "Every step's time, schedule() to the end of update_from_output()."),
        "linear": fit.linear.model_dump(),
        "calibration": {"fit_error": fit.error_summary(), "replays": replays, "base": base.name},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"{len(points)} steps of {', '.join(replays)}: {fit.linear}")
    print(f"fit error (relative, mean): {fit.error_summary()['all']['mean_abs_relative_error']:.1%}; "
          f"base {base.name}: {base.linear}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
