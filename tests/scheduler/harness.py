"""The scheduler tests' conveniences over the synthetic scheduler driver
(lab/continuum_lab/sim/driver.py, which the simulator uses too).

`Driver` steps a scheduler synchronously, each request sampling its script;
`audit` checks block accounting against the pool after any step; the rest
builds the scenarios the scheduler tests share.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_continuum.adapter.scheduler import ContinuumAsyncScheduler, ContinuumScheduler
from vllm_continuum.config import load_config
from continuum_lab.sim.driver import (
    EOS_TOKEN_ID,
    SimClock,
    block_hasher,
    new_scheduler,
    synthetic_output,
    synthetic_request,
)
from continuum_lab.sim.driver import random_tokens as tokens  # the tests' prompts

BLOCK_SIZE = 16
FILLER_TOKEN = 7  # a token the synthetic model emits that is neither EOS nor a tool call


class FakeClock(SimClock):
    """The tests' clock: starts at 1000 s."""

    def __init__(self) -> None:
        super().__init__(1000.0)


class WallClock(SimClock):
    """vLLM's wall clock (`time.time()`, where it stamps `arrival_time`), as the
    tests see it: the real epoch, far from the scheduler's clock, but moving
    only by a microsecond per request stamped. So the scheduler reads the same
    time-on-the-way for a request in every run (a real clock would make the
    random runs differ by the microseconds between building and adding)."""

    def stamp(self) -> float:
        self.advance(1e-6)
        return self.now


WALL_CLOCK = WallClock(time.time())


def make_scheduler(
    model_dir: str,
    *,
    num_blocks: int = 64,
    continuum: bool = True,
    async_scheduling: bool = False,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 1024,
    policy: str = "fcfs",
    enable_prefix_caching: bool = True,
    sliding_window: int | None = None,
    kv_transfer_config=None,
    settings: Mapping[str, object] | None = None,
    **continuum_kwargs,
):
    """`settings`: our scheduler's ContinuumConfig fields (the defaults for the
    rest), passed in as one config, as `--additional-config` would; without,
    the scheduler reads its config as in vLLM (the plugin's sources, env
    included). `continuum_kwargs` go to our scheduler (e.g. `continuum_config=`)."""
    if continuum and settings is not None:
        continuum_kwargs.setdefault("continuum_config", load_config(use_env=False, **settings))
    if continuum:
        continuum_kwargs.setdefault("continuum_wall_clock", WALL_CLOCK)
    if continuum:
        cls = ContinuumAsyncScheduler if async_scheduling else ContinuumScheduler
    else:
        cls = AsyncScheduler if async_scheduling else Scheduler
    return new_scheduler(
        cls, model_dir, num_blocks=num_blocks, block_size=BLOCK_SIZE, max_model_len=4096,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        async_scheduling=async_scheduling, policy=policy, log_stats=True,
        enable_prefix_caching=enable_prefix_caching, sliding_window=sliding_window,
        kv_transfer_config=kv_transfer_config, **continuum_kwargs,
    )


_block_hasher = block_hasher(BLOCK_SIZE)
_ids = itertools.count()  # request ids; a test may reset it


def make_request(
    prompt: list[int],
    *,
    session: str | None = None,
    max_tokens: int = 4,
    xargs: dict | None = None,
    priority: int = 0,
    cache_salt: str | None = None,
) -> Request:
    """A request as vLLM builds it: `arrival_time` is the wall clock
    (`WALL_CLOCK`, the real epoch), far from the scheduler's clock (FakeClock,
    at 1000 s), so a rule that compared the two would show. Order arrivals by
    moving the scheduler's clock between adds (`Driver.advance`)."""
    return synthetic_request(
        f"req-{next(_ids)}", list(prompt), hasher=_block_hasher, max_tokens=max_tokens,
        session=session, xargs=xargs, priority=priority, arrival=WALL_CLOCK.stamp(),
        cache_salt=cache_salt,
    )


@dataclass
class Driver:
    """Steps a scheduler with a synthetic model: each scheduled request samples
    the next token of its script (default FILLER_TOKEN)."""

    scheduler: object
    scripts: dict[str, list[int]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)

    def advance(self, seconds: float) -> None:
        """Move the scheduler's clock (ours; stock vLLM reads none)."""
        clock = getattr(getattr(self.scheduler, "continuum", None), "clock", None)
        if clock is not None:
            clock.advance(seconds)

    def add(self, request: Request, script: list[int] | None = None) -> Request:
        if script is not None:
            self.scripts[request.request_id] = list(script)
        self.scheduler.add_request(request)
        return request

    def _next_token(self, request: Request) -> int:
        script = self.scripts.get(request.request_id)
        return script.pop(0) if script else FILLER_TOKEN

    def step(self):
        s = self.scheduler
        out = s.schedule()
        runner_out, _ = synthetic_output(s, out, self._next_token)
        engine_outputs = s.update_from_output(out, runner_out)
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)
        return out

    def run_until_finished(self, *requests: Request, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            if all(r.is_finished() for r in requests):
                return
            self.step()
        raise AssertionError(f"not finished after {max_steps} steps: {requests}")


def pinned_blocks(scheduler) -> Counter:
    held: Counter = Counter()
    for pin in getattr(getattr(scheduler, "continuum", None), "pins", ()):
        held.update(b.block_id for b in pin.blocks if not b.is_null)
    return held


def audit(scheduler) -> dict[str, int]:
    """free + pinned-only + deferred-only + in-use = pool, and every ref count is explained."""
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    expected: Counter = Counter()
    for manager in kvm.coordinator.single_type_managers:
        for blocks in manager.req_to_blocks.values():
            expected.update(b.block_id for b in blocks if not b.is_null)
    in_use = set(expected)
    pinned = pinned_blocks(scheduler)
    expected.update(pinned)
    deferred: set[int] = set()
    for _, blocks in scheduler.deferred_frees:
        deferred.update(b.block_id for b in blocks if not b.is_null)
        expected.update(b.block_id for b in blocks if not b.is_null)
    for block in pool.blocks:
        if block.is_null:
            continue
        assert block.ref_cnt == expected.get(block.block_id, 0), (
            f"block {block.block_id}: ref_cnt {block.ref_cnt} != "
            f"{expected.get(block.block_id, 0)} references"
        )
    num_free = pool.get_num_free_blocks()
    pinned_only = len(set(pinned) - in_use)
    deferred_only = len(deferred - in_use - set(pinned))  # freed, behind vLLM's fence
    total = pool.num_gpu_blocks - 1
    assert num_free + pinned_only + deferred_only + len(in_use) == total, (
        num_free, pinned_only, deferred_only, in_use, total)
    return {"free": num_free, "pinned": pinned_only, "deferred": deferred_only,
            "in_use": len(in_use), "pool": total}


# --- scenario helpers shared by the scheduler tests ---------------------------
def tool_call_script(driver: Driver, name: str | None = None) -> list[int]:
    tokenizer = driver.scheduler.structured_output_manager.tokenizer
    body = tokenizer.encode(f'{{"name": "{name}"}}') if name else [FILLER_TOKEN]
    return [tokenizer.get_vocab()["<tool_call>"], *body, EOS_TOKEN_ID]


def answer_script() -> list[int]:
    return [FILLER_TOKEN, EOS_TOKEN_ID]


def first_turn(
    driver: Driver, session: str, prompt_len: int = 100, start: int = 0, name=None, **kw
):
    request = make_request(tokens(start, prompt_len), session=session, max_tokens=32, **kw)
    driver.add(request, tool_call_script(driver, name))
    driver.run_until_finished(request)
    return request


def next_turn(first, extra: int = 40, **kw):
    history = list(first.prompt_token_ids) + list(first.output_token_ids)
    return make_request(history + tokens(5000, extra), session=first.session_id, **kw)


def admitted_hit(driver: Driver, request) -> int:
    """Step until `request` is scheduled; return its prefix hit in tokens."""
    for _ in range(50):
        out = driver.step()
        for new in out.scheduled_new_reqs:
            if new.req_id == request.request_id:
                return new.num_computed_tokens
    raise AssertionError("request never admitted")


def drain(driver: Driver) -> None:
    s = driver.scheduler
    for _ in range(300):
        if not s.has_requests():
            break
        driver.step()
    assert not s.has_requests()


def assert_all_free(driver: Driver) -> None:
    s = driver.scheduler
    from vllm_continuum.core.pin_table import ReleaseReason

    s.continuum.releaser.release_all(ReleaseReason.RESET)
    counts = audit(s)
    assert counts["free"] == counts["pool"], counts
