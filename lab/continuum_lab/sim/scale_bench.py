"""`vllm-continuum scale-bench`: what one step costs at vLLM-scale state.

vLLM's real `Scheduler` and our `ContinuumScheduler`, built side by side by the
simulator's driver (driver.py) and stepped with a synthetic model output, see
the same requests at the same step. Each runs in its own process (its own
heap and garbage collector); their steps alternate, so that noise on shared
cores hits both. Requests are built as vLLM builds them: `arrival_time`
is the wall clock, our scheduler's clock is monotonic (its default).

Each scenario sets up a state of size N (1x, then 10x), then runs a bounded
number of steps with ongoing traffic, timing each `add_request` (per arrival)
and each `schedule()` + `update_from_output()` (per step; the synthetic model
output is not timed; `--clock cpu` times the thread's CPU time instead of
`time.perf_counter`). Pins do not expire during a run (`max_ttl_s` 3600), so
every step sees the scenario's whole state. A scheduler that spends more than
`--setup-budget` seconds building one scenario's state, or `--budget` seconds
in its measured steps, is abandoned there ("exceeded budget"); what it measured
until then is kept.

`LAYERS` (`--layers`) breaks our cost down, side by side with stock in one
run, by real configurations that each add one part: our hooks over vLLM's own
queue with nothing pinned (`ttl_policy: never`, `queue_order: fcfs`, which
schedules exactly as stock), then our lane queue (program admission), then
the pins (as shipped).
"""

from __future__ import annotations

import gc
import itertools
import math
import multiprocessing
import random
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

FILLER = 7  # a sampled token that is neither EOS nor <tool_call>
SETTINGS = {"max_ttl_s": 3600.0}
TOOL = {"continuum_tool": "t"}
# The schedulers of a run, by name: None is vLLM's own, else ours with these settings.
SIDES = {"ours": {}, "stock": None}
LAYERS = {"stock": None, "hooks": {"ttl_policy": "never", "queue_order": "fcfs"},
          "queue": {"ttl_policy": "never"}, "ours": {}}


class BudgetExceeded(Exception):
    pass


@contextmanager
def _alarm_raises() -> Iterator[None]:
    """SIGALRM raises BudgetExceeded (in the main thread; elsewhere budgets are checked after each call)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(*_):
        raise BudgetExceeded

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Spec:
    """One request, built anew for each scheduler (a Request is mutated by its scheduler)."""

    rid: str
    prompt: list[int]
    max_tokens: int
    session: str | None = None
    xargs: dict | None = None
    script: tuple[int, ...] = ()


@dataclass
class Side:
    """One scheduler under test, its samples (seconds) and its budget."""

    name: str
    scheduler: object
    hasher: object
    budgets: dict  # phase ("setup", "steps") -> seconds this scheduler may spend in it
    clock: Callable[[], float] = time.perf_counter  # what samples are timed with
    spent: dict = field(default_factory=lambda: {"setup": 0.0, "steps": 0.0})
    aborted: str | None = None
    steps: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    admitted: int = 0  # requests the measured steps admitted
    snapshots: list[float] = field(default_factory=list)
    setup_arrivals: deque = field(default_factory=lambda: deque(maxlen=1000))  # the last ones
    scripts: dict = field(default_factory=dict)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Counts wall time against the phase's budget; an alarm interrupts a call that overruns it."""
        budget = self.budgets[phase]
        alarm = threading.current_thread() is threading.main_thread()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, max(budget - self.spent[phase], 1e-3))
        start = time.perf_counter()
        try:
            yield
        except BudgetExceeded:
            self.aborted = f"exceeded budget {budget:g}s ({phase})"
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self.spent[phase] += time.perf_counter() - start
            if self.aborted is None and self.spent[phase] > budget:
                self.aborted = f"exceeded budget {budget:g}s ({phase})"

    def add(self, spec: Spec, record: bool) -> None:
        from continuum_lab.sim.driver import synthetic_request

        request = synthetic_request(spec.rid, spec.prompt, hasher=self.hasher, max_tokens=spec.max_tokens,
                                    session=spec.session, xargs=spec.xargs, arrival=time.time())
        self.scripts[spec.rid] = list(spec.script)
        start = self.clock()
        self.scheduler.add_request(request)
        (self.arrivals if record else self.setup_arrivals).append(self.clock() - start)

    def step(self, record: bool) -> None:
        from continuum_lab.sim.driver import synthetic_output

        s, clock = self.scheduler, self.clock
        t0 = clock()
        out = s.schedule()
        t1 = clock()
        runner_out, _ = synthetic_output(s, out, self._next_token)
        t2 = clock()
        s.update_from_output(out, runner_out)
        if record:
            self.steps.append(t1 - t0 + clock() - t2)
            self.admitted += len(out.scheduled_new_reqs)

    def _next_token(self, request) -> int:
        script = self.scripts.get(request.request_id)
        return script.pop(0) if script else FILLER


@dataclass
class Scenario:
    key: str
    what: str  # what N counts
    base: int  # N at 1x
    pool: Callable[[int], dict]  # N -> new_scheduler's sizes
    setup: Callable[["Gen", int], Iterator[list[Spec]]]  # batches, each run until idle
    traffic: Callable[["Gen", int, int], list[Spec]]  # (N, step) -> arrivals before that step
    settings: dict = field(default_factory=dict)
    queued_setup: bool = False  # setup requests only queue: no steps
    background: Callable[["Gen", int], list[Spec]] = lambda g, n: []  # long runners, after setup


class Gen:
    """Deterministic requests: ids, prompts, the tool-call script."""

    def __init__(self, tool_call_id: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.ids = itertools.count()
        self.tool_call = (tool_call_id, FILLER, 0)  # <tool_call> ... EOS

    def spec(self, n_tokens: int, max_tokens: int, **kw) -> Spec:
        prompt = [self.rng.randrange(100, 2300) for _ in range(n_tokens)]
        return Spec(f"r{next(self.ids)}", prompt, max_tokens, **kw)


def _batches(items: Iterator[Spec], size: int) -> Iterator[list[Spec]]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _pool(num_blocks: int, seqs: int, tokens: int) -> dict:
    return dict(num_blocks=num_blocks, max_num_seqs=seqs, max_num_batched_tokens=tokens)


# Prompts are random tokens (distinct first blocks); a tool-call turn samples <tool_call> ... EOS.
SCENARIOS = [
    # a. N sessions with one finished one-token turn each; then each step a new session's
    #    request, a sessionless one and one under a known session id.
    Scenario("a", "tracked sessions", 10_000, lambda n: _pool(4096, 1024, 16384),
             lambda g, n: _batches((g.spec(16, 1, session=f"a{i}") for i in range(n)), 1024),
             lambda g, n, i: [g.spec(16, 4, session=f"new{i}"), g.spec(16, 4),
                              g.spec(16, 4, session=f"a{(i * 7919) % n}")]),
    # b. N requests queued at once, every other one of a session (4 each), a pool that runs
    #    about 17 of them; then one arrival per step.
    Scenario("b", "queued requests", 500, lambda n: _pool(160, 64, 2048),
             lambda g, n: iter([[g.spec(128, 32, session=f"b{i // 4}" if i % 2 else None)
                                 for i in range(n)]]),
             lambda g, n, i: [g.spec(128, 32, session=f"b{i}" if i % 2 else None)],
             queued_setup=True),
    # c. N/17 sessions whose tool-call turn (17 blocks) is pinned, 16 at a time, in a pool with
    #    305 unpinned blocks; two long requests run (202 blocks, growing); each step one
    #    2,048-token arrival (128 blocks), every other one a new session's: its allocation
    #    fails, so pins are considered for release. Stock runs the same (4 requests at most).
    Scenario("c", "pinned blocks", 5_000, lambda n: _pool(17 * math.ceil(n / 17) + 16 * 17 + 33, 4, 2048),
             lambda g, n: _batches((g.spec(256, 8, session=f"c{i}", script=g.tool_call)
                                    for i in range(math.ceil(n / 17))), 16),
             lambda g, n, i: [g.spec(2048, 8, session=f"cn{i}" if i % 2 else None)],
             settings={"max_pinned_fraction": 1.0},
             background=lambda g, n: [g.spec(1600, 2000) for _ in range(2)]),
    # d. One session's N one-token requests with the continuum_tool hint, all queued at the
    #    first step (each pins when it finishes), run until none is left.
    Scenario("d", "tool-hinted requests of one session", 200, lambda n: _pool(4 * n + 256, 64, 8192),
             lambda g, n: iter(()),
             lambda g, n, i: [g.spec(16, 1, session="d", xargs=TOOL) for _ in range(n)] if i == 0 else []),
    # e. N pins of one session (tool-hinted requests, 50 at a time), metrics exported; then
    #    each step a new session's tool-hinted request (a pin: a change to publish) and a
    #    sessionless one. The snapshot itself is timed after the steps.
    Scenario("e", "pins of one session", 400, lambda n: _pool(2 * n + 512, 256, 8192),
             lambda g, n: _batches((g.spec(16, 1, session="e", xargs=TOOL) for _ in range(n)), 50),
             lambda g, n, i: [g.spec(16, 1, session=f"en{i}", xargs=TOOL), g.spec(16, 4)]),
]


def _side(scn: Scenario, n: int, name: str, model_dir: str, budgets: dict, clock,
          metrics_dir: str, settings: dict | None) -> Side:
    """The scheduler `name`: vLLM's own if `settings` is None, else ours with them."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_continuum.adapter.scheduler import ContinuumScheduler
    from vllm_continuum.config import load_config
    from continuum_lab.sim.driver import block_hasher, new_scheduler
    from vllm_continuum.metrics.snapshot import SnapshotWriter
    from vllm_continuum.metrics.stats import ContinuumStats

    sizes = dict(block_size=16, max_model_len=4096, **scn.pool(n))
    if settings is None:
        return Side(name, new_scheduler(Scheduler, model_dir, **sizes), block_hasher(16), budgets, clock)
    cfg = load_config(use_env=False, **{**SETTINGS, **scn.settings, **settings})
    # Scenario e exports its snapshots as a server does (CONTINUUM_METRICS_DIR); the rest do not.
    stats = ContinuumStats(writer=SnapshotWriter(metrics_dir) if scn.key == "e" else None)
    ours = new_scheduler(ContinuumScheduler, model_dir, continuum_config=cfg, continuum_stats=stats, **sizes)
    return Side(name, ours, block_hasher(16), budgets, clock)


def _run_batch(side: Side, batch: list[Spec], max_steps: int) -> None:
    """Adds the batch, then steps until none of it is left (at most max_steps)."""
    with side.timed("setup"):
        for spec in batch:
            side.add(spec, record=False)
        for _ in range(max_steps):
            if not any(spec.rid in side.scheduler.requests for spec in batch):
                break
            side.step(record=False)


def _time_snapshots(side: Side, count: int) -> None:
    """The adapter's metrics path (`_publish` -> `ContinuumStats.publish` -> a snapshot
    written), made due `count` times: a change to publish, the last write long ago."""
    stats = side.scheduler.continuum.stats
    with side.timed("steps"):
        for _ in range(count):
            stats.on_invalid_hints(0)  # counts as a change: the next publish writes
            stats._written_at = float("-inf")  # (past any rate limit)
            start = side.clock()
            side.scheduler._publish()
            side.snapshots.append(side.clock() - start)


def run_scenario(scn: Scenario, n: int, model_dir: str, steps: int, budgets: dict,
                 clock: Callable[[], float] = time.perf_counter, bar=None,
                 sides: dict[str, dict | None] = SIDES) -> dict:
    """The schedulers (`sides`, default ours and stock) through the scenario at
    size n: its summary per scheduler. budgets: seconds per scheduler for the
    setup and for the measured steps.

    Each scheduler lives in its own (forked) process, so that each pays the
    garbage collections its own allocations cause, as it would alone in an
    engine core; with one shared heap a collection lands in whichever side's
    step crosses the threshold. The processes take turns: one runs a step
    while the other waits, who goes first alternating."""
    ctx = multiprocessing.get_context("fork")
    workers = []
    try:
        for name, settings in sides.items():
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, scn, n, name, settings, model_dir, budgets, clock),
                               name=f"scale-bench-{name}", daemon=True)
            proc.start()
            workers.append((name, mine, proc))
        for _, conn, _ in workers:  # one after the other: setup is not measured, but budgeted
            _ask(conn, "setup")
        for i in range(steps):
            order = workers[i % len(workers):] + workers[:i % len(workers)]
            if not [_ask(conn, "step", i) for _, conn, _ in order].count(True):
                break  # no side has anything left to do
            if bar is not None:
                bar.update(1)
        return {"n": n, **{name: _ask(conn, "end") for name, conn, _ in workers}}
    finally:
        for _, conn, proc in workers:
            conn.close()
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def _ask(conn, command: str, arg=None):
    conn.send((command, arg))
    ok, answer = conn.recv()
    if not ok:
        raise RuntimeError(f"scale-bench worker failed on {command!r}:\n{answer}")
    return answer


def _serve(conn, scn: Scenario, n: int, name: str, settings: dict | None, model_dir: str,
           budgets: dict, clock) -> None:
    """One scheduler's process: builds its state, then runs what the parent asks, in order."""
    import traceback

    with tempfile.TemporaryDirectory() as metrics_dir, _alarm_raises():
        try:
            side = _side(scn, n, name, model_dir, budgets, clock, metrics_dir, settings)
            g = Gen(side.scheduler.structured_output_manager.tokenizer.get_vocab()["<tool_call>"])
        except Exception:  # noqa: BLE001  (reported to the parent, which raises it)
            conn.recv()
            conn.send((False, traceback.format_exc()))
            return
        while True:
            command, arg = conn.recv()
            try:
                answer = _COMMANDS[command](side, scn, g, n, arg)
            except Exception:  # noqa: BLE001
                conn.send((False, traceback.format_exc()))
                return
            conn.send((True, answer))
            if command == "end":
                return


def _setup(side: Side, scn: Scenario, g: Gen, n: int, _arg) -> None:
    batches = [(b, 0 if scn.queued_setup else 100_000) for b in scn.setup(g, n)]
    for batch, max_steps in [*batches, (scn.background(g, n), 1)]:
        if side.aborted is None:
            _run_batch(side, batch, max_steps)
    # As vLLM's engine core does after start-up (freeze_gc_heap): collect, then freeze, so
    # that no full collection of the setup's heap lands in a measured step.
    gc.collect()
    gc.freeze()


def _measured_step(side: Side, scn: Scenario, g: Gen, n: int, i: int) -> bool:
    """Step i's arrivals, then the step: False if there was nothing to do (or the budget is spent)."""
    specs = scn.traffic(g, n, i)
    if side.aborted is not None or not specs and not side.scheduler.has_requests():
        return False
    with side.timed("steps"):
        for spec in specs:
            side.add(spec, record=True)
        side.step(record=True)
    return True


def _end(side: Side, scn: Scenario, g: Gen, n: int, _arg) -> dict:
    if scn.key == "e" and side.name == "ours" and side.aborted is None:
        _time_snapshots(side, 5)
    return {**_summary(side), "state": _state(side)}


_COMMANDS = {"setup": _setup, "step": _measured_step, "end": _end}


def _state(side: Side) -> dict:
    """What the scheduler holds at the end: the scenario's load, checked rather than assumed."""
    s = side.scheduler
    out = {"waiting": len(s.waiting), "running": len(s.running),
           "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()}
    c = getattr(s, "continuum", None)
    if c is not None:  # the controller's tables, read defensively: the core may reshape them
        facts = {"sessions": lambda: len(c.programs), "pins": lambda: len(c.pins),
                 "pinned_blocks": lambda: c.pins.num_pinned_blocks,
                 "max_pins_of_a_session": lambda: max(Counter(p.session_id for p in c.pins).values(),
                                                      default=0),
                 "releases": lambda: dict(c.stats.releases_by_reason)}
        for name, read in facts.items():
            try:
                out[name] = read()
            except Exception:  # noqa: BLE001  (informational only)
                out[name] = None
    return out


def _summary(side: Side) -> dict:
    out = {"aborted": side.aborted, "seconds": {k: round(v, 2) for k, v in side.spent.items()},
           "admitted": side.admitted}
    for name in ("steps", "arrivals", "snapshots", "setup_arrivals"):
        xs = sorted(getattr(side, name))
        if xs:
            pick = lambda q: xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]  # noqa: E731
            out[name] = {"count": len(xs), "mean_us": round(sum(xs) / len(xs) * 1e6, 1),
                         **{k: round(pick(q) * 1e6, 1)
                            for k, q in (("p50_us", 0.5), ("p99_us", 0.99), ("max_us", 1.0))}}
    return out
