"""The simulator: real schedulers, synthetic outputs, a cost model (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_continuum.core.ttl import TurnEnd
from continuum_lab.report import summarize
from continuum_lab.sim.cost_model import CostModel, Linear, fit_linear, load_cost_model
from continuum_lab.sim.loop import Simulation
from continuum_lab.sim.oracle import Hindsight, OracleTTLPolicy
from continuum_lab.sim.run import prepare_run, simulate
from continuum_lab.workload_spec import load_spec

# A small server under memory pressure: 3,072 tokens of KV for programs whose
# contexts reach about 1.5k tokens, several in flight.
SMALL = CostModel(
    name="test-small",
    kind="linear",
    block_size=16,
    num_gpu_blocks=193,
    max_num_seqs=64,
    max_num_batched_tokens=1024,
    max_model_len=4096,
    linear=Linear(step_s=0.01, per_token_s=2e-4, per_pair_s=2e-8, per_seq_s=1e-3),
)


@pytest.fixture(scope="module")
def trace():
    return load_spec("cpu-agent").with_overrides(num_programs=8, arrival_rate=1.0, seed=1).generate()


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "profile.yaml"
    SMALL.prefill_profile().save(path)
    return str(path)


def _run(trace, policy, profile_path):
    return Simulation(trace, SMALL, policy, prefill_profile_path=profile_path).run()


def test_small_run_completes_every_turn(trace, profile_path):
    results = {p: _run(trace, p, profile_path) for p in ("stock", "continuum", "oracle")}
    n_turns = sum(len(p.turns) for p in trace)
    for policy, run in results.items():
        assert len(run.programs) == len(trace), policy
        assert len(run.turns) == n_turns, policy
        for t in run.turns:
            assert 0 <= t.cached_tokens <= t.prompt_tokens
            assert t.ttft_s > 0 and t.latency_s >= t.ttft_s
        for p in run.programs:
            assert p.jct_s > 0
    oracle = results["oracle"].meta["continuum_stats"]
    # It never guesses wrong: a pin expires only when its next turn queued for
    # more than the one grace step past the TTL (the TTL is a hard bound).
    pinned = oracle["resumes_by_outcome"].get("pinned", 0)
    assert pinned > 0
    assert oracle["releases_by_reason"].get("expired", 0) * 4 <= pinned
    # Under this pressure stock vLLM's prefix cache loses some sessions' history.
    assert summarize(results["stock"])["reuse_of_prev_prompt"] < 0.95
    assert results["stock"].meta.get("continuum_stats") is None


def test_oracle_hindsight_knows_what_the_run_before_saw(trace, profile_path):
    """`oracle-hindsight` reruns the oracle without the pins pressure released
    before their return, and with each pin lasting until its next turn was
    admitted; the rerun makes none of the first, and the policy keeps the
    better run."""
    first = Simulation(trace, SMALL, "oracle", prefill_profile_path=profile_path)
    first_run = first.run()
    taken = first.pressure_releases[0].turns
    assert taken, "the small server is under pressure: some oracle pins are taken back"
    assert taken <= first.pressure_releases[0].pinned
    known = Hindsight().after(taken, first.admission_waits)
    program, turn = next(iter(taken))
    assert known.pin_s(program, turn, 1.0) is None
    waited = next(k for k, w in first.admission_waits.items() if w > 0 and k[1] > 0)
    assert known.pin_s(waited[0], waited[1] - 1, 1.0) == 1.0 + first.admission_waits[waited]
    again = Simulation(trace, SMALL, "oracle", prefill_profile_path=profile_path, hindsight=known)
    again.run()
    assert again.pressure_releases[0].pinned, "the other turns are still pinned"
    assert not again.pressure_releases[0].pinned & taken
    best, _ = simulate(trace, SMALL, "oracle-hindsight", Path(profile_path), progress=False)
    assert best.label == "oracle-hindsight"
    assert summarize(best)["jct_mean_s"] <= summarize(first_run)["jct_mean_s"]


@pytest.fixture(scope="module")
def mixed_trace():
    return load_spec("cpu-mixed").with_overrides(num_programs=6, arrival_rate=1.0, seed=1).generate()


def test_small_mixed_run_keeps_one_shot_requests_apart(mixed_trace, profile_path):
    """Under stock and continuum every one-shot request is served once, recorded
    apart, and left out of the agents' figures."""
    agents, chat = mixed_trace.agents, mixed_trace.one_shots
    assert len(agents) == 6 and len(chat) >= 3
    for policy in ("stock", "continuum"):
        run = _run(mixed_trace, policy, profile_path)
        assert sorted(p.program for p in run.programs) == sorted(p.id for p in agents), policy
        assert len(run.turns) == sum(len(p.turns) for p in agents), policy
        assert {t.program for t in run.turns} <= {p.id for p in agents}
        assert sorted(t.program for t in run.one_shot) == sorted(p.id for p in chat), policy
        by_id = {p.id: p for p in chat}
        for t in run.one_shot:
            request = by_id[t.program]
            assert t.sent_s == pytest.approx(request.arrival_s)
            assert (t.prompt_tokens, t.output_tokens) == (request.turns[0].new_tokens,
                                                          request.turns[0].output_tokens)
            assert 0 < t.ttft_s <= t.latency_s
        s = summarize(run)
        assert s["programs"] == len(agents) and s["one_shot_requests"] == len(chat)
        assert 0 < run.meta["pool_usage_mean"] <= run.meta["pool_usage_max"] <= 1


def test_one_shot_requests_carry_no_session(mixed_trace, profile_path):
    """What the scheduler sees: an agent turn has its session and hints, a one-shot
    request neither (so the continuum scheduler can neither pin nor reorder it by session)."""
    from continuum_lab.sim.loop import _Live

    sim = Simulation(mixed_trace, SMALL, "continuum", prefill_profile_path=profile_path)
    agent, chat = mixed_trace.agents[0], mixed_trace.one_shots[0]
    a = sim._request(_Live(agent, 0, 0.0, [101] * 8, [102]))
    c = sim._request(_Live(chat, 0, 0.0, [103] * 8, [104]))
    assert a.session_id == agent.id
    assert a.sampling_params.extra_args == {"continuum_tool": agent.turns[0].tool}
    assert c.session_id is None and not c.sampling_params.extra_args


def test_simulation_is_deterministic(trace, profile_path):
    a = _run(trace, "continuum", profile_path).to_json()
    b = _run(trace, "continuum", profile_path).to_json()
    a.pop("started_at"), b.pop("started_at")
    assert a == b


def test_num_blocks_gives_the_same_server_another_pool(tmp_path):
    """`sim --num-blocks`: the cost model's pool replaced, nothing else, and the
    simulated stock server evicts more in the smaller pool."""
    reuse = {}
    for blocks in (120, 750):
        _, cost, profile, trace = prepare_run(tmp_path / str(blocks), "cpu-bench-2l-noon",
                                                "cpu-overload", num_blocks=blocks, num_programs=6)
        assert cost == load_cost_model("cpu-bench-2l-noon").model_copy(update={"num_gpu_blocks": blocks})
        run, _ = simulate(trace, cost, "stock", profile, progress=False)
        reuse[blocks] = summarize(run)["reuse_of_prev_prompt"]
    assert reuse[120] < reuse[750]


def test_h100_cost_model_is_sane():
    cost = load_cost_model("h100-llama3.1-8b")
    cold = 8192 / cost.step_time([(8192, 0)])
    assert 10_000 < cold < 40_000  # tokens/s of a cold 8k prefill on an H100 for 8B
    decode = cost.step_time([(1, 4096)] * 16)
    assert 0.005 < decode < 0.03
    assert cost.pool_tokens == pytest.approx(396_000, rel=0.01)
    profile = cost.prefill_profile()
    assert profile.seconds(10_000) == pytest.approx(cost.prefill_seconds(10_000), rel=0.1)


def test_fit_linear_reproduces_the_profile():
    """Tokens cost what the profile says; the constant is the measured decode step
    (the profile's c0 is a request's end-to-end overhead), or c0 without one."""
    from vllm_continuum.core.prefill_profile import PrefillProfile

    profile = PrefillProfile(0.5, 1e-3, 2e-6)
    lin = fit_linear(profile, decode_step_s=0.02)
    cost = SMALL.model_copy(update={"linear": lin, "max_num_batched_tokens": 100_000})
    for n in (128, 1000, 3000):
        assert cost.prefill_seconds(n) - lin.step_s == pytest.approx(profile.seconds(n) - 0.5, rel=1e-6)
    assert cost.step_time([(1, 256)]) == pytest.approx(0.02, rel=1e-6)
    without = SMALL.model_copy(update={"linear": fit_linear(profile, None),
                                       "max_num_batched_tokens": 100_000})
    assert without.prefill_seconds(1000) == pytest.approx(profile.seconds(1000), rel=1e-6)


def test_oracle_policy():
    durations = {"a": 1.5, "b": 30.0}
    turn = TurnEnd(session_id="a", tool="grep", num_context_tokens=1000)
    always = OracleTTLPolicy(durations.get, slack_s=0.25)
    assert always.decide(turn).ttl_s == pytest.approx(1.75)
    assert always.decide(TurnEnd("b", "pytest", 1000)).ttl_s == pytest.approx(30.25)  # uncapped
    assert always.decide(TurnEnd("zz", "x", 10)).ttl_s == 0
    eq2 = OracleTTLPolicy(durations.get, slack_s=0.25, mode="eq2", benefit=lambda t: 5.0)
    assert eq2.decide(turn).ttl_s == pytest.approx(1.75)  # 5 s saved > 1.5 s pinned
    assert eq2.decide(TurnEnd("b", "pytest", 1000)).ttl_s == 0  # 30 s pinned > 5 s saved
    capped = OracleTTLPolicy(durations.get, slack_s=0.25, mode="cap", cap_s=20.0)
    assert capped.decide(turn).ttl_s == pytest.approx(1.75)
    assert capped.decide(TurnEnd("b", "pytest", 1000)).ttl_s == 0  # returns after the cap


def test_seed_summary_ratios_and_ties():
    from continuum_lab.sim.run import seed_summary

    rows = [
        {"seed": 0, "label": "stock", "jct_mean_s": 20.0},
        {"seed": 0, "label": "a", "jct_mean_s": 10.0},
        {"seed": 0, "label": "b", "jct_mean_s": 10.0},
        {"seed": 1, "label": "stock", "jct_mean_s": 10.0},
        {"seed": 1, "label": "a", "jct_mean_s": 20.0},
        {"seed": 1, "label": "b", "jct_mean_s": 5.0},
    ]
    lines = {line.split(" | ")[0].strip("| "): line for line in seed_summary(rows)[2:]}
    # a: ratios 2.0 and 0.5 -> geometric mean 1; lowest (tied with b) in seed 0 only.
    assert lines["a"] == "| a | 1.000x | 0.50x | 2.00x | 1 of 2 seeds |"
    # b: ratios 2.0 and 2.0; lowest in both seeds (seed 0 tied with a).
    assert lines["b"] == "| b | 2.000x | 2.00x | 2.00x | 2 of 2 seeds |"
    assert lines["stock"] == "| stock | 1.000x | 1.00x | 1.00x | 0 of 2 seeds |"


def test_seed_summary_with_one_shot_traffic():
    """The policy's one-shot p99 TTFT over stock's, per seed: 2x and 8x -> geometric mean 4x."""
    from continuum_lab.sim.run import seed_summary

    rows = [{"seed": seed, "label": label, "jct_mean_s": jct, "one_shot_requests": 9,
             "one_shot_ttft_p99_s": p99}
            for seed, label, jct, p99 in ((0, "stock", 20.0, 1.0), (0, "a", 10.0, 2.0),
                                          (1, "stock", 10.0, 0.5), (1, "a", 10.0, 4.0))]
    lines = seed_summary(rows)
    assert lines[0].endswith("| one-shot p99 TTFT / stock's, geometric mean | min | max |")
    assert lines[3] == "| a | 1.414x | 1.00x | 2.00x | 2 of 2 seeds | 4.000x | 2.00x | 8.00x |"


@pytest.mark.parametrize(
    "policy, pressure",
    [("continuum", "hold"), ("continuum-yield", "yield"), ("oracle-hold", "hold"), ("forever-yield", "yield")],
)
def test_policy_names_pick_their_pressure_policy(policy, pressure, profile_path):
    """A plain name runs the configured default (hold); a suffix pins one, so that
    a benchmark's labels stay true when the default changes."""
    from continuum_lab.sim.driver import SimClock
    from continuum_lab.sim.policies import build_scheduler

    built = build_scheduler(policy, SMALL, SimClock(), prefill_profile_path=profile_path,
                            oracle_durations=lambda request_id: 1.0)
    assert built.scheduler.continuum.config.pressure_policy == pressure


def test_seed_plot_is_written(tmp_path):
    from continuum_lab.sim.run import plot_seeds

    rows = [{"seed": s, "label": label, "jct_mean_s": jct}
            for s in (0, 1) for label, jct in (("stock", 10.0), ("continuum-hold", 8.0 + s))]
    path = plot_seeds(rows, tmp_path, "(test)")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("policy", ["stock", "continuum"])
def test_tiny_case_step_by_step(policy, profile_path):
    """One program, two turns, worked out by hand (block 16, step = 0.1 s + 1 ms
    per scheduled token):
      t=0      turn 0 arrives: 32 prompt tokens
      step 1   prefill 32 -> first token            0.132 s  -> t=0.132
      step 2   decode 1 -> second (last) token      0.101 s  -> t=0.233
      tool     1.0 s                                         -> t=1.233 turn 1 arrives
               prompt 32 + 2 + 16 = 50 tokens; KV was computed for 33 of turn 0's
               tokens, 2 full blocks are cached -> 32 cached, 18 to prefill
      step 3   prefill 18 -> its only token         0.118 s  -> t=1.351, JCT 1.351
    The pool is far from full, so continuum must not change a thing."""
    from continuum_lab.trace_format import Program, Trace, Turn

    cost = SMALL.model_copy(update={"linear": Linear(step_s=0.1, per_token_s=1e-3, per_pair_s=0.0)})
    trace = Trace([Program("p", 0.0, (Turn(32, 2, "t", 1.0), Turn(16, 1)))])
    sim = Simulation(trace, cost, policy, prefill_profile_path=profile_path)
    run = sim.run()
    assert sim.stats.steps == 3 and sim.stats.idle_jumps == 1 and sim.stats.stalls == 0
    assert sim.stats.busy_s == pytest.approx(0.132 + 0.101 + 0.118)
    t0, t1 = run.turns
    assert (t0.prompt_tokens, t0.cached_tokens, t0.output_tokens) == (32, 0, 2)
    assert (t0.ttft_s, t0.latency_s) == (pytest.approx(0.132), pytest.approx(0.233))
    assert (t1.prompt_tokens, t1.cached_tokens, t1.prev_prompt_tokens) == (50, 32, 32)
    assert t1.sent_s == pytest.approx(1.233)
    assert (t1.ttft_s, t1.latency_s) == (pytest.approx(0.118), pytest.approx(0.118))
    assert run.programs[0].jct_s == pytest.approx(1.351)
    # The pool (192 usable blocks of 16) holds 2, 3, then 4 blocks while the steps run.
    used = [2 / 192, 3 / 192, 4 / 192]
    assert run.meta["pool_usage_max"] == pytest.approx(used[-1])
    assert run.meta["pool_usage_mean"] == pytest.approx(
        (used[0] * 0.132 + used[1] * 0.101 + used[2] * 0.118) / (0.132 + 0.101 + 0.118))


# ------------------------------------------------------------ several instances
def _ring_owner(key: str, num_instances: int, vnodes: int) -> int:
    """The ring's rule, written out: instance i owns the points blake2b-64 of
    "instance-i#v"; a key goes to the owner of the first point at or after its own."""
    import hashlib

    def h(s: str) -> int:
        return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")

    points = sorted((h(f"instance-{i}#{v}"), i) for i in range(num_instances) for v in range(vnodes))
    return next((i for p, i in points if p >= h(key)), points[0][1])


class _View:
    """What a router sees of an instance, set by hand."""

    def __init__(self, load: int, hits: dict[str, int] | None = None) -> None:
        self.load = load
        self.hits = hits or {}

    def cached_tokens(self, request) -> int:
        return self.hits.get(request.session_id, 0)


def _req(session: str | None):
    from types import SimpleNamespace

    return SimpleNamespace(session_id=session)


def test_hash_ring_by_hand():
    from continuum_lab.sim.routing import HashRing

    keys = [f"session-{k}" for k in range(40)]
    for n, vnodes in ((2, 1), (3, 5), (8, 100)):
        ring = HashRing(n, vnodes)
        for key in keys:
            walk = list(ring.walk(key))
            assert walk[0] == _ring_owner(key, n, vnodes), (n, vnodes, key)
            assert sorted(walk) == list(range(n))  # the walk visits every instance once
    # Both instances own keys (with one point each they may split unevenly, not all-or-nothing).
    owners = {_ring_owner(k, 2, 1) for k in keys}
    assert owners == {0, 1}


def test_routers_by_hand():
    from continuum_lab.sim.routing import make_router

    rr = make_router("round_robin", 2)
    assert [rr.route(_req("a"), [_View(5), _View(0)]) for _ in range(4)] == [0, 1, 0, 1]

    ll = make_router("least_loaded", 2)
    assert ll.route(_req("a"), [_View(2), _View(1)]) == 1
    assert ll.route(_req("a"), [_View(1), _View(1)]) == 0  # tie: the lowest index

    ca = make_router("cache_aware", 2)
    assert ca.route(_req("a"), [_View(0), _View(5, {"a": 32})]) == 1  # the hit wins over load
    assert ca.route(_req("a"), [_View(3, {"a": 16}), _View(2, {"a": 16})]) == 1  # tie: less loaded
    assert ca.route(_req("a"), [_View(0), _View(0)]) == 0  # cold prompt, equal loads

    ch = make_router("consistent_hash", 2)
    home = _ring_owner("a", 2, 100)
    loads = [0, 0]
    loads[home] = 50
    assert ch.route(_req("a"), [_View(x) for x in loads]) == home  # whatever its load
    # Requests without a session go round robin.
    assert [ch.route(_req(None), [_View(0), _View(0)]) for _ in range(3)] == [0, 1, 0]

    # Bounded (eps 0.25): the cap is ceil(1.25 x (total load + 1) / 2).
    bounded = make_router("consistent_hash_bounded", 2)
    away = 1 - home
    for home_load, away_load, expected in (
        (1, 1, home),  # cap ceil(1.875) = 2: home (1) is under it
        (2, 0, away),  # cap 2: home is at it, the next on the ring takes it
        (3, 0, away),  # cap ceil(2.5) = 3
        (3, 3, home),  # cap ceil(4.375) = 5
    ):
        loads = [0, 0]
        loads[home], loads[away] = home_load, away_load
        assert bounded.route(_req("a"), [_View(x) for x in loads]) == expected, (home_load, away_load)
    with pytest.raises(ValueError):
        make_router("random", 2)


def _three_programs():
    """Two turns each (32 prompt + 2 output tokens, a 1 s tool, then 16 new + 1 output),
    arriving at 0, 0.05 and 0.1 s."""
    from continuum_lab.trace_format import Program, Trace, Turn

    return Trace([Program(pid, t, (Turn(32, 2, "t", 1.0), Turn(16, 1)))
                  for pid, t in (("a", 0.0), ("b", 0.05), ("c", 0.1))])


@pytest.mark.parametrize("policy", ["stock", "forever"])
def test_two_instances_by_hand(policy, profile_path, tmp_path):
    """Two instances, step = 0.1 s + 1 ms per token, worked out by hand.
    The ring (_ring_owner) puts sessions a and c on instance 1, b on instance 0.
    Under every router a0 and c0 share an instance, b0 has the other:
      0.00  a0 arrives: prefill [0, 0.132]; c0 (0.10) waits for that step's end,
            then a0's last decode + c0's prefill [0.132, 0.265], c0's decode [0.265, 0.366]
      0.05  b0 arrives: [0.05, 0.182], [0.182, 0.283]
    so the second turns arrive 1 s after: a1 1.265, b1 1.283, c1 1.366 (prompt 50
    tokens, 32 of them cached where the first turn ran, none elsewhere).
      round_robin:  a0 0, b0 1, c0 0, a1 1, b1 0, c1 1: every second turn moves
      least_loaded: a0 0 (tie), b0 1 (0 busy), c0 0 (1-1 tie); a1 0 (all idle),
                    b1 1 (a1 on 0), c1 0 (a1, b1 in flight: tie): by luck, all stay
      cache_aware:  first turns as least_loaded; each second turn where its 32 tokens are
      consistent_hash: each session on its owner; bounded: the same, as no instance
                    reaches the cap (c0: loads 1, 1, cap ceil(1.25 x 3 / 2) = 2)
    `forever` pins every first turn until its next turn: a pin is reached exactly
    when the second turn stays."""
    cost = SMALL.model_copy(update={"linear": Linear(step_s=0.1, per_token_s=1e-3, per_pair_s=0.0)})
    trace = _three_programs()
    hashed = {p: _ring_owner(p, 2, 100) for p in "abc"}
    assert hashed == {"a": 1, "b": 0, "c": 1}
    from continuum_lab.sim.cluster import cluster_row, cluster_table, plot_cluster

    rows = []
    expected = {
        "round_robin": {"a": (0, 1), "b": (1, 0), "c": (0, 1)},
        "least_loaded": {"a": (0, 0), "b": (1, 1), "c": (0, 0)},
        "cache_aware": {"a": (0, 0), "b": (1, 1), "c": (0, 0)},
        "consistent_hash": {p: (i, i) for p, i in hashed.items()},
        "consistent_hash_bounded": {p: (i, i) for p, i in hashed.items()},
    }
    for routing, where in expected.items():
        sim = Simulation(trace, cost, policy, prefill_profile_path=profile_path,
                         instances=2, routing=routing)
        run = sim.run()
        assert {p: (sim.placements[(p, 0)], sim.placements[(p, 1)]) for p in "abc"} == where, routing
        times = {(t.program, t.turn): round(t.sent_s, 3) for t in run.turns}
        assert times == {("a", 0): 0.0, ("b", 0): 0.05, ("c", 0): 0.1,
                         ("a", 1): 1.265, ("b", 1): 1.283, ("c", 1): 1.366}, routing
        for t in run.turns:
            if t.turn == 1:
                stays = where[t.program][0] == where[t.program][1]
                assert (t.prompt_tokens, t.cached_tokens) == (50, 32 if stays else 0), (routing, t)
        c = run.meta["cluster"]
        stayed = sum(a == b for a, b in where.values())
        assert c["routed"] == [sum(x.count(i) for x in where.values()) for i in (0, 1)]
        assert (c["pinned_turns"], c["reached_pin"]) == ((3, stayed) if policy == "forever" else (0, 0))
        assert len(run.programs) == 3 and len(run.turns) == 6
        rows.append(cluster_row(run, routing, policy))
        assert rows[-1]["same_instance_share"] == pytest.approx(stayed / 3)
        assert rows[-1]["routed_max_over_mean"] == pytest.approx(max(c["routed"]) / 3)
    table = cluster_table(rows).splitlines()
    assert len(table) == 2 + len(expected) and table[2].startswith(f"| round_robin | {policy} |")
    assert plot_cluster(rows, tmp_path).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("routing", ["round_robin", "cache_aware"])
def test_one_instance_behind_a_router_changes_nothing(routing, trace, profile_path):
    """The router's look at the prefix cache (cache_aware) allocates nothing and
    touches nothing: one instance behind it runs exactly as one alone."""
    alone = Simulation(trace, SMALL, "continuum", prefill_profile_path=profile_path).run().to_json()
    routed = Simulation(trace, SMALL, "continuum", prefill_profile_path=profile_path,
                        instances=1, routing=routing).run().to_json()
    assert routed["meta"].pop("cluster")["routed"] == [sum(len(p.turns) for p in trace)]
    assert routed == alone


@pytest.mark.parametrize("policy", ["stock", "continuum", "forever"])
def test_multi_instance_run_completes_every_turn(policy, trace, profile_path):
    """Three instances under memory pressure, every router: every turn is served,
    consistent hashing keeps each session on its ring owner, and (with `forever`,
    whose pins never expire) an instance counts a resumed turn as pinned exactly
    when the router sent it to the instance holding its pin."""
    from continuum_lab.sim.routing import ROUTINGS

    n_turns = sum(len(p.turns) for p in trace)
    for routing in ROUTINGS:
        sim = Simulation(trace, SMALL, policy, prefill_profile_path=profile_path,
                         instances=3, routing=routing)
        run = sim.run()
        assert len(run.programs) == len(trace) and len(run.turns) == n_turns, routing
        for t in run.turns:
            assert 0 <= t.cached_tokens <= t.prompt_tokens and 0 < t.ttft_s <= t.latency_s
        c = run.meta["cluster"]
        assert sum(c["routed"]) == n_turns and len(sim.placements) == n_turns
        assert sum(c["busy_s"]) == pytest.approx(run.meta["busy_s"])
        if routing == "consistent_hash":
            for p in trace:
                assert {sim.placements[(p.id, k)] for k in range(len(p.turns))} == {
                    _ring_owner(p.id, 3, 100)}, p.id
        if policy == "forever":
            assert c["pinned_turns"] > 0
            assert run.meta["continuum_stats"]["resumes_by_outcome"].get("pinned", 0) == c["reached_pin"]
            if routing == "round_robin":
                assert c["reached_pin"] < c["pinned_turns"]  # about 1 in 3 comes back
        elif policy == "stock":
            assert c["pinned_turns"] == 0
