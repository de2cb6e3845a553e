"""Scale-out pieces that need no server: the DP rank of a session (run against
vLLM's own load balancer code, on both vLLM builds: scripts/test.sh runs this
file under official 0.33 too), and the broken-affinity signal."""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest

from vllm_continuum.core.affinity import AffinityMonitor, SeenTurn, count_token, is_affinity_miss
from vllm_continuum.adapter.dp_affinity import choose_rank, install, rank_for_session, runs_continuum

# ------------------------------------------------------------------ DP rank


def test_rank_is_stable_and_spread():
    ranks = [rank_for_session(f"session-{i}", 4) for i in range(4000)]
    assert ranks == [rank_for_session(f"session-{i}", 4) for i in range(4000)]
    counts = Counter(ranks)
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 < c < 1200 for c in counts.values()), counts
    # A known value: the same in every process and release (SHA-256, not hash()).
    assert rank_for_session("agent-42", 2) == rank_for_session("agent-42", 2)
    assert rank_for_session("x", 1) == 0


def test_explicit_rank_wins_and_no_session_falls_back():
    assert choose_rank("s", 1, 4) == 1  # X-data-parallel-rank header or a router
    assert choose_rank(None, None, 4) is None  # vLLM's balancer decides
    assert choose_rank("", None, 4) is None
    assert choose_rank("s", None, 1) is None  # one rank: nothing to choose
    assert choose_rank("s", None, 4) == rank_for_session("s", 4)


def _fake_client(num_engines: int, scheduler_cls="continuum"):
    engines = [bytes([i]) for i in range(num_engines)]
    return SimpleNamespace(
        core_engines=engines,
        reqs_in_flight={},
        engine_inflight=defaultdict(int),
        lb_engines=[[0, 0, 0.0] for _ in engines],
        eng_start_index=0,
        client_count=1,
        client_index=0,
        streaming_reqs=set(),  # 0.33
        vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(scheduler_cls=scheduler_cls)),
    )


def _request(rid: str, session: str | None, rank: int | None = None):
    return SimpleNamespace(request_id=rid, session_id=session, data_parallel_rank=rank,
                           pooling_params=None, resumable=False)


def test_vllm_balancer_is_wrapped_and_keeps_sessions_on_one_rank():
    """The wrap, driven through the installed vLLM's own DPLBAsyncMPClient code."""
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core_client import DPLBAsyncMPClient

    # What the wrap relies on exists in this vLLM build.
    assert {"session_id", "data_parallel_rank"} <= set(EngineCoreRequest.__struct_fields__)
    assert install()
    assert install()  # idempotent (the plugin runs several times per process)
    choose = DPLBAsyncMPClient.get_core_engine_for_request

    client = _fake_client(4)
    for turn in range(3):
        for s in range(20):
            engine = choose(client, _request(f"r{s}-{turn}", f"sess-{s}"))
            assert engine == client.core_engines[rank_for_session(f"sess-{s}", 4)]
    # An explicit rank (the X-data-parallel-rank header) wins over the session.
    assert choose(client, _request("explicit", "sess-0", rank=3)) == client.core_engines[3]
    # No session: vLLM's balancer spreads the load (all engines used).
    fresh = _fake_client(4)
    used = {choose(fresh, _request(f"anon-{i}", None)) for i in range(8)}
    assert used == set(fresh.core_engines)


def test_stock_scheduler_servers_keep_vllms_balancing():
    from vllm.v1.engine.core_client import DPLBAsyncMPClient

    install()
    client = _fake_client(2, scheduler_cls=None)
    engines = {DPLBAsyncMPClient.get_core_engine_for_request(client, _request(f"r{i}", "one"))
               for i in range(6)}
    assert engines == set(client.core_engines)  # one session, spread: not ours to change
    assert runs_continuum(SimpleNamespace(scheduler_config=SimpleNamespace(scheduler_cls="continuum")))
    assert runs_continuum(SimpleNamespace(scheduler_config=SimpleNamespace(
        scheduler_cls="vllm_continuum.adapter.scheduler.ContinuumScheduler")))
    assert not runs_continuum(None)


# ------------------------------------------------------- broken affinity

R, C = 7, 5  # the tool-result and tool-call token ids


def test_counts_and_rule():
    assert count_token([1, R, 2, R], R) == 2
    assert count_token((1, R), R) == 1 and count_token(iter([R, R]), R) == 2
    assert count_token([1, 2], None) == 0
    assert not is_affinity_miss(0, None)  # a first turn
    assert is_affinity_miss(1, None)  # a continuation this engine never saw
    assert not is_affinity_miss(1, SeenTurn(10, 1))  # the turn after one call served here
    assert not is_affinity_miss(2, SeenTurn(10, 2))  # two parallel calls served here
    assert is_affinity_miss(2, SeenTurn(10, 1))  # a turn ran elsewhere in between
    assert is_affinity_miss(1, SeenTurn(10, 0))  # the turn seen here made no call


@pytest.mark.parametrize(
    "route, misses",
    [
        ("AAAA", 0),  # affine: never
        ("ABAB", 3),  # round robin over two engines: every turn after the first
        ("AABB", 1),  # moved once
        ("ABBA", 2),  # left and came back: both counted
        ("AAAB", 1),
    ],
)
def test_monitors_on_two_engines_count_each_turn_that_continues_elsewhere(route, misses):
    engines = {e: AffinityMonitor(R, C) for e in "AB"}
    prompt = [1, 2, 3]
    for turn, engine in enumerate(route):
        monitor = engines[engine]
        monitor.on_arrival("s", f"t{turn}", prompt)
        output = [9, C, 9]  # every turn calls one tool
        monitor.on_finish("s", f"t{turn}", output)
        prompt = prompt + output + [R, 4]  # history + the tool's result
    assert sum(m.misses for m in engines.values()) == misses


def test_monitor_ignores_requests_without_session_and_models_without_marker():
    m = AffinityMonitor(R, C)
    assert not m.on_arrival(None, "r", [R, R])
    off = AffinityMonitor(None, C)
    assert not off.active and not off.on_arrival("s", "r", [R])


def test_monitor_is_bounded_and_calls_back():
    hits = []
    m = AffinityMonitor(R, C, on_miss=lambda: hits.append(1), max_sessions=3)
    for i in range(10):
        m.on_arrival(f"s{i}", "r", [1])
    assert len(m._seen) == 3
    assert m.on_arrival("s0", "r2", [R])  # forgotten: looks new, and it has a result
    assert hits == [1] and m.misses == 1
