"""The schedulers `compare --step-log` runs: vLLM's and continuum's, each
recording every step it runs to the file `--additional-config`'s
`step_log` names (step_log.py says what is recorded and why). They read the
scheduler's output after it returns and decide nothing."""

from __future__ import annotations

import json
import time

from vllm.v1.core.sched.scheduler import Scheduler

from vllm_continuum.adapter.scheduler import ContinuumScheduler
from continuum_lab.step_log import STEP_LOG_KEY


class StepRecording:
    """The recording, over any vLLM scheduler (a mixin, first in the bases)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        path = (self.vllm_config.additional_config or {}).get(STEP_LOG_KEY)
        self._step_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - the server's lifetime
        self._step: dict | None = None

    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        if self._step is not None:  # the previous step's cycle ends here
            self._write(self._step | {"cycle_s": start - self._step["t"]})
            self._step = None
        out = super().schedule(*args, **kwargs)
        if self._step_log is not None and out.total_num_scheduled_tokens:
            # After schedule() a request's num_computed_tokens includes this step's.
            batch = [[n, self.requests[rid].num_computed_tokens - n]
                     for rid, n in out.num_scheduled_tokens.items()]
            self._step = {"t": start, "batch": batch, "schedule_s": time.perf_counter() - start,
                          "waiting": len(self.waiting)}
        return out

    def update_from_output(self, *args, **kwargs):
        begun = time.perf_counter()
        result = super().update_from_output(*args, **kwargs)
        if self._step is not None and "step_s" not in self._step:
            ended = time.perf_counter()
            self._step |= {"step_s": ended - self._step["t"], "update_s": ended - begun}
            if not self.has_unfinished_requests():  # the engine idles next: no cycle
                self._write(self._step)
                self._step = None
        return result

    def _write(self, step: dict) -> None:
        self._step_log.write(json.dumps(step) + "\n")


class StockStepRecorder(StepRecording, Scheduler):
    """vLLM's own scheduler, recording: `--scheduler-cls` of stock under --step-log."""


class ContinuumStepRecorder(StepRecording, ContinuumScheduler):
    """Continuum's scheduler, recording: `--scheduler-cls` of a continuum flavour under --step-log."""
