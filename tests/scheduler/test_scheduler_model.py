"""The TTL model and Algorithm 1 wired into vLLM's scheduler: measured tool
durations, T and eta, tool names read in the engine, program-level order,
and the `hold` pressure policy with its deadlock guard."""

from __future__ import annotations


import pytest
from vllm.v1.request import RequestStatus

from tests.scheduler.harness import (
    EOS_TOKEN_ID,
    admitted_hit,
    answer_script,
    first_turn,
    make_request,
    next_turn,
    tokens,
)


def encode(driver, text: str) -> list[int]:
    return driver.scheduler.structured_output_manager.tokenizer.encode(text)


def tool_token(driver) -> int:
    return driver.scheduler.structured_output_manager.tokenizer.get_vocab()["<tool_call>"]


@pytest.mark.parametrize(
    "body, tool",
    [
        ('{"name": "web_search", "arguments": {"q": "x"}}', "web_search"),
        ('{"name": "calc", "argum', "calc"),  # cut off mid-JSON (max_tokens)
        ('{"nam": "calc"}', "unknown"),  # malformed
        ("not json at all", "unknown"),
        ("", "unknown"),
    ],
)
def test_tool_name_is_read_in_the_engine(build, body, tool):
    d = build()
    turn = make_request(tokens(0, 64), session="A", max_tokens=64)
    d.add(turn, [tool_token(d), *encode(d, body), EOS_TOKEN_ID])
    d.run_until_finished(turn)
    assert d.scheduler.continuum.pins.get("A").tool == tool


def test_the_hint_overrides_the_parsed_name(build):
    d = build()
    turn = make_request(tokens(0, 64), session="A", max_tokens=64, xargs={"continuum_tool": "mine"})
    d.add(turn, [tool_token(d), *encode(d, '{"name": "theirs"}'), EOS_TOKEN_ID])
    d.run_until_finished(turn)
    assert d.scheduler.continuum.pins.get("A").tool == "mine"


def test_configured_patterns_recognise_plain_text_tool_calls(build):
    d = build(settings={"tool_call_patterns": [r"```bash\s*\n\s*(\w+)"]})
    shell = make_request(tokens(0, 64), session="A", max_tokens=64)
    d.add(shell, [*encode(d, "Let me look.\n```bash\nls -la\n```"), EOS_TOKEN_ID])
    plain = make_request(tokens(900, 64), session="B", max_tokens=64)
    d.add(plain, [*encode(d, "All done, no command."), EOS_TOKEN_ID])
    d.run_until_finished(shell, plain)
    assert d.scheduler.continuum.pins.get("A").tool == "ls"
    assert d.scheduler.continuum.pins.get("B") is None


def test_tool_durations_t_and_eta_are_measured(build):
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "A", name="search")
    s.continuum.clock.advance(1.25)  # the tool runs
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    admitted_hit(d, t2)
    assert s.continuum.workload.tools.of(None).durations.of("search").sorted == [pytest.approx(1.25)]

    # B's pin expires before its next turn: that turn's queueing delay is T.
    u1 = first_turn(d, "B", start=3000, name="search")
    s.continuum.clock.advance(60)
    u2 = next_turn(u1, xargs={"continuum_last_turn": 1})
    d.add(u2, answer_script())
    assert len(s.continuum.workload.queueing) == 0
    admitted_hit(d, u2)
    assert len(s.continuum.workload.queueing) == 1
    assert s.continuum.stats.resumes_by_outcome == {"pinned": 1, "unpinned": 1}
    d.run_until_finished(u2)
    assert len(s.continuum.workload.programs) == 1  # B ended with its last-turn hint: 2 turns
    assert s.continuum.workload.programs._programs[0] == 2


def test_idle_sessions_count_as_finished_programs(build):
    d = build(settings={"program_idle_horizon_s": 100})
    s = d.scheduler
    first_turn(d, "A")
    s.continuum.clock.advance(101)
    d.add(make_request(tokens(5000, 16)))
    assert list(s.continuum.workload.programs._programs) == [1]


def test_continuum_policy_decides_by_the_measured_cdf(build, tmp_path):
    """Past K samples, a tool that returns fast is pinned for its duration and
    one that takes far longer than a reload is worth is not pinned."""
    profile = tmp_path / "profile.yaml"
    profile.write_text("c0: 2.0\nc1: 0.0\nc2: 0.0\n")  # reload costs 2 s, whatever the length
    d = build(settings={"ttl_policy": "continuum", "pin_cost": "always",  # Eq. 2 as the paper has it
                        "cold_start_samples": 2, "prefill_profile": str(profile)})
    s = d.scheduler
    for i, (tool, pause) in enumerate([("fast", 0.2), ("slow", 20.0)] * 3):
        t1 = first_turn(d, f"S{i}", start=400 * i, name=tool)
        s.continuum.clock.advance(pause)
        t2 = next_turn(t1, xargs={"continuum_last_turn": 1})
        d.add(t2, answer_script())
        d.run_until_finished(t2)
    first_turn(d, "probe-fast", start=9000, name="fast")
    first_turn(d, "probe-slow", start=9500, name="slow")
    decisions = s.continuum.stats.ttl_decisions[-2:]
    assert decisions[0] == ("fast", pytest.approx(0.2), "tool CDF")
    assert decisions[1] == ("slow", 0.0, "tool CDF")
    assert s.continuum.pins.get("probe-fast") is not None and s.continuum.pins.get("probe-slow") is None


@pytest.mark.parametrize("order, expected", [
    ("program_fcfs", ["a2", "b1", "loner"]),
    # Requests without a session (one-turn programs) first, then program order.
    ("sessionless_first", ["loner", "a2", "b1"]),
    ("pinned_fcfs", ["b1", "loner", "a2"]),  # arrival order, as stock
])
def test_program_level_fcfs(build, order, expected):
    """Without pins, an older program's later turn goes before a newer
    program's first request (then arrival order); `queue_order` says where
    requests without a session go."""
    d = build(max_num_seqs=1, settings={"ttl_policy": "never", "queue_order": order})
    s = d.scheduler
    a1 = make_request(tokens(0, 32), session="A", max_tokens=2)
    d.add(a1)
    d.run_until_finished(a1)
    busy = make_request(tokens(3000, 32), max_tokens=6)
    d.advance(1.0)
    d.add(busy)
    d.step()
    b1 = make_request(tokens(4000, 32), session="B", max_tokens=2)
    loner = make_request(tokens(5000, 32), max_tokens=2)
    a2 = make_request(tokens(0, 40), session="A", max_tokens=2)
    for r in (b1, loner, a2):
        d.advance(0.5)
        d.add(r)
    names = {a2.request_id: "a2", b1.request_id: "b1", loner.request_id: "loner"}
    assert [names[r.request_id] for r in s.waiting] == expected


def _pressure_state(build, policy: str):
    """A pin, a long-running request, and a newcomer that fits only if the
    pin goes."""
    d = build(num_blocks=41, settings={"pressure_policy": policy})
    first_turn(d, "A", prompt_len=300)  # ~20 blocks pinned
    runner = make_request(tokens(2000, 100), max_tokens=40)  # 7 -> 9 blocks, runs a while
    d.add(runner)
    d.step()
    newcomer = make_request(tokens(6000, 350), max_tokens=2)  # 22 blocks: > 21 free without the pin
    d.add(newcomer)
    d.step()
    return d, runner, newcomer


def test_yield_admits_the_newcomer_at_once(build):
    d, runner, newcomer = _pressure_state(build, "yield")
    assert newcomer.status == RequestStatus.RUNNING or newcomer.is_finished()
    assert d.scheduler.continuum.stats.releases_by_reason == {"pressure": 1}


def test_hold_keeps_the_pin_while_work_runs_then_the_guard_admits(build):
    d, runner, newcomer = _pressure_state(build, "hold")
    s = d.scheduler
    assert newcomer.status == RequestStatus.WAITING and s.continuum.pins.get("A") is not None
    d.run_until_finished(runner)
    assert s.continuum.pins.get("A") is not None  # still held: it was under the cap
    d.step()  # nothing runs: the deadlock guard releases the pin
    assert newcomer.status == RequestStatus.RUNNING or newcomer.is_finished()
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}
