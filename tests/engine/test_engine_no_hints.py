"""The replay without client hints (`--hints none`) on the session's real servers:
the engine writes each tool turn's call, and continuum reads it by itself."""

from __future__ import annotations

from collections import Counter

import pytest

from continuum_lab.live.replay import replay
from continuum_lab.live.server_counters import continuum_counters, engine_preemptions
from continuum_lab.trace_format import Program, Trace, Turn


def _delta(after: dict, before: dict, key: str) -> dict:
    out = Counter(after.get(key, {}))
    out.subtract(before.get(key, {}))
    return {k: n for k, n in out.items() if n}


@pytest.mark.engine
def test_without_hints_continuum_reads_the_tool_calls_and_pins(live_servers):
    """Two programs (three tool-call turns) and a one-shot request, sent with only
    the session id. On continuum (fixed 30 s TTL, DEMO_SETTINGS) the server reads
    each trace tool from the output, pins, and every resumed turn comes back to
    its pin with its previous prompt cached; stock serves the same bodies."""
    trace = Trace([
        Program("a", 0.0, (Turn(300, 40, "grep", 0.3), Turn(64, 8, "read_file", 0.2), Turn(64, 6))),
        Program("b", 0.1, (Turn(250, 12, "run_tests", 0.2), Turn(64, 6))),
        Program("c", 0.2, (Turn(200, 4),), one_shot=True),
    ], {"seed": 0})
    continuum = live_servers["continuum"]
    before = continuum_counters(continuum.base_url)
    run = replay(continuum.base_url, trace, hints="none", progress=False,
                 session_prefix="no-hints-")
    after = continuum_counters(continuum.base_url)
    assert not run.errors, run.errors
    assert _delta(after, before, "tool_calls_read") == {"grep": 1, "read_file": 1, "run_tests": 1}
    assert after["pins"] - before["pins"] == 3
    assert _delta(after, before, "resumes") == {"pinned": 3}
    by_key = {(t.program, t.turn): t for t in run.turns}
    for t in run.turns:
        if t.turn:
            assert t.cached_tokens >= t.prev_prompt_tokens // 32 * 32, t
    # A tool turn is the call, padded to about the trace's length; other turns exact.
    assert 30 <= by_key[("a", 0)].output_tokens <= 60, by_key[("a", 0)]
    assert by_key[("a", 2)].output_tokens == 6 and run.one_shot[0].output_tokens == 4

    # vLLM's own preemption counter, which compare reads around every replay:
    # exported by the real server, and still on a pool these few turns fit.
    preempted = engine_preemptions(live_servers["stock"].base_url)
    stock = replay(live_servers["stock"].base_url, trace, hints="none", progress=False)
    assert not stock.errors, stock.errors
    assert len(stock.turns) == 5 and len(stock.one_shot) == 1
    assert preempted is not None and engine_preemptions(live_servers["stock"].base_url) == preempted
