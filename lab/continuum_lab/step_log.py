"""Every engine step of a live server, timed, beside the cost model's time
for the same batch.

`predict` found the simulator fast, and faster the more a flavour
re-prefills (docs/results/benchmarks-archive.md, "Mixed steps, preemptions, and every step
the server ran"). Either the live engine's steps take longer than the cost
model says for what they hold, or it runs other steps (other batches) than
the simulator. A step log tells them apart. With `compare --step-log`, each
server runs its scheduler (vLLM's own for stock, continuum's otherwise) as
a subclass that only records (step_recorder.py). One JSON line per step:

- `t`: when `schedule()` began (perf_counter seconds, system-wide on Linux);
- `batch`: [new tokens, tokens already computed] per scheduled request;
- `step_s`: from `schedule()` to the end of `update_from_output()`;
  `schedule_s` and `update_s`, the two calls' own part of it;
- `cycle_s`: to the next `schedule()`, where requests remained (the engine
  core's own work between steps included);
- `waiting`: the waiting queue's length after scheduling.

It decides nothing; the file is named by `--additional-config`'s
`step_log`. The CPU build of vLLM schedules synchronously
(vllm/platforms/cpu.py), so one step's calls bracket its forward pass; under
async scheduling they would not. `predict` reads a log against its cost
model (prediction/step_speed.py).
"""

from __future__ import annotations

import json
from pathlib import Path

STEP_LOG_KEY = "step_log"  # --additional-config's key: the file to record to


# `--scheduler-cls` of a server that records, by server kind (step_recorder.py).
RECORDERS = {
    "stock": "continuum_lab.step_recorder.StockStepRecorder",
    "continuum": "continuum_lab.step_recorder.ContinuumStepRecorder",
}


def read_steps(path: Path, start: float = float("-inf"), end: float = float("inf")) -> list[dict]:
    """The steps begun within [start, end] (perf_counter seconds, system-wide on Linux)."""
    steps = []
    for line in Path(path).read_text().splitlines():
        step = json.loads(line)
        if start <= step["t"] <= end and "step_s" in step:
            steps.append(step)
    return steps

