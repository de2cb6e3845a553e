"""The API server's time per request, which the simulator does not have.

The simulator models engine steps; a live client also waits for HTTP, the
API server's queues and streaming, about `api_overhead_s` per request
(measured by `calibrate`: the intercept of time to first token). The whole
of it is put before the engine, so the simulated engine receives a request
that much after the client sent it: the trace's arrivals and every tool
pause (in engine time, from a turn's end to the next turn's receipt) grow by
it, and the client-side times are read back by shifting each record. Where
it actually falls (in, out) only changes which of two near-simultaneous
requests the engine sees first.
"""

from __future__ import annotations

from dataclasses import replace

from continuum_lab.results import RunResult
from continuum_lab.trace_format import Trace


def engine_trace(sent: Trace, overhead_s: float) -> Trace:
    """`sent` (client times) as the engine receives it."""
    programs = []
    for p in sent:
        last = len(p.turns) - 1
        turns = tuple(t if k == last else replace(t, tool_s=t.tool_s + overhead_s)
                      for k, t in enumerate(p.turns))
        programs.append(replace(p, arrival_s=p.arrival_s + overhead_s, turns=turns))
    return Trace(programs, dict(sent.meta))


def as_client_saw(run: RunResult, overhead_s: float) -> RunResult:
    """A simulated run of engine_trace(...), in the client's times (in place)."""
    for rec in [*run.turns, *run.one_shot]:
        rec.sent_s -= overhead_s
        rec.ttft_s += overhead_s
        rec.latency_s += overhead_s
    for p in run.programs:
        p.arrival_s -= overhead_s
    return run
