"""Program-level admission (issue 19), scheduler level, both vLLM builds, sync
and async: when the agents' contexts do not fit the pool, programs are served
in arrival order (core/program_order.py).

The synthetic engine's clock advances `STEP_S` per step whatever the step
computes, so a re-prefill costs nothing here: these tests check who goes
first and that everyone gets through; what the order is worth (programs
finishing sooner than on stock) is measured with a cost model, in the
simulator (`vllm-continuum sim`/`matrix`, docs/benchmarks.md, issue 19).
Agents run programs of a few turns: a turn decodes a few tokens and calls a
tool, the tool takes a few steps, the next turn continues the context; the
last turn answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from vllm.v1.request import RequestStatus

from tests.scheduler.harness import (
    EOS_TOKEN_ID,
    FILLER_TOKEN,
    Driver,
    FakeClock,
    audit,
    make_request,
    make_scheduler,
    tokens,
)
from vllm_continuum.config import load_config
from vllm_continuum.core.pin_table import ReleaseReason

STEP_S = 0.1
NUM_BLOCKS = 64  # x 16 tokens: the programs' contexts (up to ~300 tokens each) do not all fit


@dataclass
class Program:
    name: str
    arrives: int  # step
    turns: int
    prompt: list[int]
    pause: int = 3  # steps its tool takes
    decode: int = 6  # tokens a turn decodes before its tool call (or answer)
    grows: bool = True  # each turn's prompt extends the last one's context (else: the same prompt)
    xargs: dict | None = None  # hints sent with every turn
    salt: str | None = None  # its cache_salt (a tenant)
    turn: int = 0
    live: object = None
    paused: int = 0
    first_admitted: int | None = None
    ended: int | None = None


@dataclass
class Agents:
    """Programs of `turns` turns each (turns=None: endless), stepped together."""

    driver: Driver
    clock: FakeClock
    tool_token: int
    programs: list[Program] = field(default_factory=list)
    one_shots: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # id -> (added, admitted)
    step_no: int = 0

    def _send(self, p: Program) -> None:
        last = p.turns is not None and p.turn == p.turns - 1
        script = ([FILLER_TOKEN] * p.decode + ([EOS_TOKEN_ID] if last
                                               else [self.tool_token, FILLER_TOKEN, EOS_TOKEN_ID]))
        xargs = {**(p.xargs or {}), **({"continuum_last_turn": True} if last else {})}
        p.live = make_request(p.prompt, session=p.name, max_tokens=p.decode + 10, xargs=xargs or None,
                              cache_salt=p.salt)
        self.driver.add(p.live, script)

    def add_one_shot(self, size: int) -> str:
        r = make_request(tokens(7000 + self.step_no, size), max_tokens=4)
        self.driver.add(r, [FILLER_TOKEN, EOS_TOKEN_ID])
        self.one_shots[r.request_id] = (self.step_no, None)
        return r.request_id

    def run(self, max_steps: int, until=None) -> None:
        for _ in range(max_steps):
            for p in self.programs:
                if p.arrives == self.step_no and p.live is None:
                    self._send(p)
            out = self.driver.step()
            audit(self.driver.scheduler)
            self.step_no += 1
            self.clock.advance(STEP_S)
            admitted = {n.req_id for n in out.scheduled_new_reqs}
            for rid in admitted & set(self.one_shots):
                added, _ = self.one_shots[rid]
                self.one_shots[rid] = (added, self.one_shots[rid][1] or self.step_no)
            for p in self.programs:
                if p.live is not None and p.live.request_id in admitted and p.first_admitted is None:
                    p.first_admitted = self.step_no
                if p.live is not None and p.live.is_finished():
                    if p.grows:
                        p.prompt = list(p.live.all_token_ids) + tokens(100 * p.turn + len(p.name), 16)
                    p.live, p.turn = None, p.turn + 1
                    if p.turns is not None and p.turn >= p.turns:
                        p.ended = self.step_no
                    else:
                        p.paused = p.pause
                elif p.live is None and p.ended is None and p.turn > 0:
                    p.paused -= 1
                    if p.paused <= 0:
                        self._send(p)
            if until is not None and until():
                return


def agents(model_dir, async_scheduling, flavour: str, programs, **settings) -> Agents:
    """flavour: stock, or continuum with the shipped defaults and `settings`."""
    stock = flavour == "stock"
    extra = {} if stock else {"continuum_config": load_config(use_env=False, **settings)}
    s = make_scheduler(model_dir, num_blocks=NUM_BLOCKS, async_scheduling=async_scheduling,
                       continuum=not stock, max_num_seqs=16, max_num_batched_tokens=512, **extra)
    clock = FakeClock()
    if not stock:
        s.continuum.clock = clock
    tool = s.structured_output_manager.tokenizer.get_vocab()["<tool_call>"]
    return Agents(Driver(s), clock, tool, [
        Program(f"p{i}", arrives, turns, tokens(i, size)) for i, (arrives, turns, size) in enumerate(programs)
    ])


# Twelve programs of 6 turns, arriving every 4 steps, first prompts of 64-160 tokens:
# their contexts (up to ~300 tokens, 19 blocks each) are far more than the pool holds.
BATCH = [(4 * i, 6, 64 + 32 * (i % 4)) for i in range(12)]


def test_programs_are_admitted_in_arrival_order_and_all_finish(tiny_model_dir, async_scheduling):
    a = agents(tiny_model_dir, async_scheduling, "continuum", BATCH)
    a.run(3000, until=lambda: all(p.ended is not None for p in a.programs))
    assert all(p.ended is not None for p in a.programs), "a program starved"
    firsts = [p.first_admitted for p in a.programs]
    assert firsts == sorted(firsts), f"a later program's first turn went first: {firsts}"
    s = a.driver.scheduler
    assert s.continuum.stats.releases_by_reason.get("resumed", 0) > 0
    s.continuum.releaser.release_all(ReleaseReason.RESET)
    counts = audit(s)
    assert counts["free"] == counts["pool"]


@pytest.mark.parametrize("ttl_policy", ["forever", "continuum"])
@pytest.mark.parametrize("admission", ["program", "request"])
def test_a_one_shot_keeps_its_waiting_bound(tiny_model_dir, async_scheduling, admission, ttl_policy):
    """A 400-token one-shot arrives while the batch keeps the pool full: it is
    admitted within the bound (1 s = 10 steps) plus the agent turns already
    running, as under the previous rule; with the shipped TTL (pins wait for
    the bound) and the learned one (contested pins may give way sooner)."""
    a = agents(tiny_model_dir, async_scheduling, "continuum", BATCH, admission=admission,
               max_queue_delay_s=1.0, ttl_policy=ttl_policy, cold_start_samples=0)
    a.run(40)
    rid = a.add_one_shot(400)
    a.run(200, until=lambda: a.one_shots[rid][1] is not None)
    added, admitted = a.one_shots[rid]
    assert admitted is not None and admitted - added <= 10 + 12, (added, admitted)


def test_an_endless_session_does_not_starve_a_new_program(tiny_model_dir, async_scheduling):
    """Eight endless sessions, more than the pool holds, always have a turn
    queued ahead of a new program arriving at step 20. With a precedence of
    3 s (30 steps) it is admitted once they lose their place, plus the turns
    already running; with an hour, it waits the whole run."""
    endless = [(0, None, 300) for _ in range(8)]
    waits = {}
    for precedence in (3.0, 3600.0):
        a = agents(tiny_model_dir, async_scheduling, "continuum", [*endless, (20, 2, 300)],
                   program_precedence_s=precedence)
        newcomer = a.programs[-1]
        a.run(400, until=lambda: newcomer.first_admitted is not None)
        waits[precedence] = (newcomer.first_admitted - 20) if newcomer.first_admitted else None
    print("\nnew program's wait in steps behind endless sessions:", waits)
    assert waits[3.0] is not None and waits[3.0] <= 30 + 15, waits
    assert waits[3600.0] is None or waits[3600.0] > waits[3.0], waits


# --------------------------------------------------- program order by service
def test_a_one_turn_program_goes_before_other_programs_remaining_turns(tiny_model_dir,
                                                                       async_scheduling):
    """Six endless programs keep the pool full and turns of theirs queued; a
    one-turn program that carries a session id arrives at step 60. By
    arrival it waits behind their remaining turns; by attained service
    (`program_order: service`) it has been served nothing, so it goes first
    in the regular lane, as a request without a session would."""
    waits = {}
    for order in ("arrival", "service"):
        a = agents(tiny_model_dir, async_scheduling, "continuum",
                   [*[(0, None, 260) for _ in range(6)], (60, 1, 200)], program_order=order,
                   max_ttl_s=0.5)
        for p in a.programs[:6]:
            p.pause = 8  # longer than max_ttl_s: their next turns queue in the regular lane
        chat = a.programs[-1]
        a.run(400, until=lambda: chat.first_admitted is not None)
        waits[order] = chat.first_admitted - 60 if chat.first_admitted is not None else None
    print(f"\nsteps the one-turn program waited: {waits}")
    assert waits["service"] is not None
    assert waits["arrival"] is None or waits["service"] < waits["arrival"], waits


def test_a_long_program_waits_at_most_the_turn_bound_behind_new_programs(tiny_model_dir,
                                                                         async_scheduling):
    """Under `program_order: service` a stream of new programs (served nothing)
    goes before a long program's next turn; once later programs have gone
    ahead of it for the turn bound, it goes before them: admitted within T
    plus the turns then running. Without the bound it waits behind the stream."""
    stream = [(2 + 4 * i, 2, 240) for i in range(60)]
    waits = {}
    for bound in (2.0, math.inf):
        a = agents(tiny_model_dir, async_scheduling, "continuum", [(0, 3, 300), *stream],
                   program_order="service", max_ttl_s=0.5, max_turn_delay_s=bound)
        long = a.programs[0]
        long.pause = 30  # its pin expires: the next turn queues in the regular lane
        a.run(400, until=lambda: long.turn == 1 and long.live is not None)
        assert long.live is not None
        sent, second = a.step_no, long.live
        a.run(400, until=lambda: second.status != RequestStatus.WAITING)
        waits[bound] = a.step_no - sent if second.status != RequestStatus.WAITING else None
    print(f"\nsteps the long program's next turn waited, by turn bound: {waits}")
    assert waits[2.0] is not None and waits[2.0] <= 2.0 / STEP_S + 15, waits
    assert waits[math.inf] is None or waits[math.inf] > waits[2.0], waits
