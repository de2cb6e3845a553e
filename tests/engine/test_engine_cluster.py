"""Scale-out, live: two continuum instances of the tiny model behind vLLM's
router (vllm-router, the `cluster` extra), a data-parallel server, and the
instances' KV events read by a real ZMQ subscriber.

One module-scoped cluster serves every router policy (a router is started
per test, the instances stay up), and the DP server boots beside it.
Each routing test runs 8 agent sessions x 4 model calls through the router,
with tool pauses, while other users' traffic cycles both KV pools
(`vllm_continuum.cluster.scenario`); every response names the instance that
served it (`X-Continuum-Instance`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import msgspec
import pytest
import zmq
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from vllm_continuum.config import additional_config_arg
from vllm_continuum.adapter.dp_affinity import rank_for_session
from vllm_continuum.cluster.local_cluster import Cluster, Instance
from vllm_continuum.cluster.scenario import (
    ScenarioResult,
    _ask,
    format_turns,
    run_sessions,
)
from vllm_continuum.demos.pause_scenario import churn
from vllm_continuum.tools.local_server import BLOCK_SIZE, CPU_SERVER_FLAGS, free_port, stop_process_group

pytestmark = pytest.mark.engine

NUM_BLOCKS = 224  # 8 pinned sessions of ~14 blocks fit on one instance under the 0.6 cap
SETTINGS = {"ttl_policy": "fixed", "default_ttl_s": 30, "max_pinned_fraction": 0.6}
ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache, for the KV-events reset check
ARGS = [*CPU_SERVER_FLAGS, "--num-gpu-blocks-override", str(NUM_BLOCKS),
        "--max-model-len", "2048", "--served-model-name", "tiny"]
RESULTS: dict[str, dict] = {}  # label -> summary, printed at the end of the module


@pytest.fixture(scope="module")
def dp_server_started(tiny_model_dir, tmp_path_factory):
    """`vllm serve --data-parallel-size 2` (the CPU build runs it): started here,
    waited for in its own test, so that it boots while the cluster boots."""
    log = tmp_path_factory.mktemp("dp-logs") / "dp.log"
    server = Instance(tiny_model_dir, ["--scheduler-cls", "continuum", *ARGS,
                                       "--data-parallel-size", "2",
                                       *additional_config_arg(SETTINGS)],
                      env=ENV, log_path=log, name="dp2")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory, dp_server_started):
    log_dir = tmp_path_factory.mktemp("cluster")
    with Cluster(tiny_model_dir, 2, log_dir, ARGS, env=ENV, settings=SETTINGS) as c:
        yield c
    print("\nscale-out measurements (resumed turns of 8 sessions x 4 calls):")
    for label, summary in RESULTS.items():
        print(f"  {label}: {json.dumps(summary)}")


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory):
    """A real Prometheus on configs/prometheus.yml's cluster job, its targets
    pointed at the live instances (the single-server job dropped)."""
    import yaml

    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("Prometheus is not installed: run scripts/setup.sh (Debian package `prometheus`)")
    config = yaml.safe_load((ROOT / "configs" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "vllm-cluster")
    job["static_configs"][0]["targets"] = [s.base_url.removeprefix("http://") for s in cluster.servers]
    config["scrape_configs"] = [job]
    config["global"]["scrape_interval"] = "1s"
    home = tmp_path_factory.mktemp("prometheus-cluster")
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(home / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [exe, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is None and _up(url) == len(cluster.servers), 60,
                 "Prometheus scraping every instance")
        yield url
    finally:
        stop_process_group(proc, timeout_s=30)
        log.close()


def _query(url: str, expr: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _up(url: str) -> int:
    try:
        return sum(float(s["value"][1]) == 1 for s in _query(url, 'up{job="vllm-cluster"}'))
    except (httpx.HTTPError, AssertionError, ValueError):
        return 0


def continuum_counters(url: str) -> dict[str, float]:
    """continuum_* counter samples of one instance, keyed `name{label=value}`."""
    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("continuum_") and s.name.endswith("_total"):
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                 if k != "model_name")
                out[f"{s.name}{{{label}}}"] = s.value
    return out


def delta(before: list[dict], after: list[dict], key: str) -> float:
    return sum(a.get(key, 0) - b.get(key, 0) for b, a in zip(before, after))


def run_behind(cluster: Cluster, label: str, policy: str, extra=()) -> tuple[ScenarioResult, dict]:
    router = cluster.start_router(policy, list(extra), block_size=BLOCK_SIZE)
    urls = [s.base_url for s in cluster.servers]
    try:
        before = [continuum_counters(u) for u in urls]
        result = run_sessions(router.base_url, urls, prefix=f"{label}-", seed=1)
        time.sleep(1.0)  # the engines publish their last snapshot when they go idle
        after = [continuum_counters(u) for u in urls]
    finally:
        cluster.stop_router()
    counts = {
        "affinity_misses": delta(before, after, "continuum_affinity_misses_total{}"),
        "pinned_resumes": delta(before, after, "continuum_resumes_total{outcome=pinned}"),
        "unpinned_resumes": delta(before, after, "continuum_resumes_total{outcome=unpinned}"),
    }
    moved = [t for t in result.resumed if t.moved]
    RESULTS[label] = {**result.summary(), **counts, "moved": len(moved)}
    print(format_turns(result, f"{label} ({policy} {' '.join(extra)})"))
    print(f"{label}: {counts}, moved turns: {len(moved)}")
    return result, counts


def assert_affine(result: ScenarioResult, counts: dict) -> None:
    assert len(result.resumed) == 24
    for t in result.resumed:
        assert t.instance.startswith("instance-"), t  # our middleware answered
        assert t.instance == t.prev_instance, f"{t.session} turn {t.turn} left its pin: {t}"
        assert t.reused_all(BLOCK_SIZE), f"{t.session} turn {t.turn} lost blocks: {t}"
    assert counts["affinity_misses"] == 0
    assert counts["unpinned_resumes"] == 0
    assert counts["pinned_resumes"] >= 24  # retried tool turns resume too


def test_consistent_hash_keeps_every_session_on_its_pin(cluster):
    result, counts = run_behind(cluster, "consistent_hash", "consistent_hash")
    assert_affine(result, counts)


def test_kv_aware_with_session_affinity_keeps_every_session_on_its_pin(cluster):
    """kv_aware is fed by the instances' KV events (relayed to loopback TCP).
    Untuned it kept 15/24 turns home (its scoring recomputes vLLM's block
    hashes and skips requests with tools; docs/scaling.md), so its session
    affinity (an idle TTL above the pin TTL) is what keeps agents home."""
    result, counts = run_behind(cluster, "kv_aware+affinity", "kv_aware",
                                ["--kv-aware-session-affinity-ttl-secs", "120"])
    assert_affine(result, counts)
    log = Path(cluster.log_dir / "router-kv_aware.log").read_text(errors="replace")
    for url, endpoint in cluster.kv_event_sources.items():
        assert f"kv_index subscriber for {url}" in log and endpoint in log


def test_program_scheduling_binding_only_keeps_every_session_on_its_pin(cluster):
    """The recommended way to combine vllm-router's program scheduling with
    ours (docs/scaling.md): its program identity and binding, our retention."""
    config = {"program_scheduling_enable_key": "auto", "binding_only": True}
    result, counts = run_behind(
        cluster, "consistent_hash+program_binding_only", "consistent_hash",
        ["--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(config)])
    assert_affine(result, counts)


def test_round_robin_loses_pins_and_the_engines_see_it(cluster, prometheus):
    """Measured and printed; asserted only what must hold once turns move."""
    result, counts = run_behind(cluster, "round_robin", "round_robin")
    moved = [t for t in result.resumed if t.moved]
    # 8 concurrent sessions alternate over two instances: some turns move.
    assert moved
    # Each session's first move lands on an instance that never saw it: the
    # engines count it, and that turn found no pin there.
    assert counts["affinity_misses"] >= 1


def test_dashboard_cluster_row_shows_each_instance(cluster, prometheus):
    """The dashboard's Cluster row, evaluated on what Prometheus scraped from
    both instances (configs/prometheus.yml's cluster job): a series per
    instance, and the broken-affinity counter moved by the round-robin run."""
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "vllm-continuum.json").read_text())
    panels, in_cluster = [], False
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            in_cluster = panel["title"] == "Cluster"
        elif in_cluster:
            panels.append(panel)
    assert {p["title"] for p in panels} >= {
        "Pins and pinned sessions by instance", "Resumes by instance: pinned vs unpinned",
        "Pinned-block share by instance", "Broken session affinity by instance"}
    values = {"$model_name": "tiny", "$instance": ".*", "$__rate_interval": "10m",
              "$__range": "1h"}
    instances = {s.base_url.removeprefix("http://") for s in cluster.servers}
    time.sleep(2.5)  # two more scrapes after the last run
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in values.items():
                expr = expr.replace(var, value)
            result = _query(prometheus, expr)
            assert result, (panel["title"], expr)
            if "by (instance" in expr:
                assert {r["metric"]["instance"] for r in result} == instances, (panel["title"], result)
    misses = _query(prometheus, 'sum(continuum_affinity_misses_total{job="vllm-cluster"})')
    assert float(misses[0]["value"][1]) >= 1
    # The variable's query lists both instances.
    listed = httpx.get(f"{prometheus}/api/v1/label/instance/values",
                       params={"match[]": 'continuum_pinned_blocks{model_name="tiny"}'},
                       timeout=10).json()["data"]
    assert set(listed) == instances


# ------------------------------------------------------------------ KV events


class Subscriber:
    """A real ZMQ SUB socket on an instance's KV-event publisher, decoding
    vLLM's KVEventBatch; keeps every event with its arrival time."""

    def __init__(self, endpoint: str) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self.events: list[tuple[float, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                _topic, _seq, payload = self._sock.recv_multipart()
                batch = self._decoder.decode(payload)
                now = time.monotonic()
                self.events.extend((now, e) for e in batch.events)

    def of(self, kind: str, since: float = 0.0) -> list:
        return [e for t, e in self.events if type(e).__name__ == kind and t >= since]

    def removed(self, since: float = 0.0) -> set:
        return {h for e in self.of("BlockRemoved", since) for h in e.block_hashes}

    def stored_by(self, session: str) -> set:
        return {h for e in self.of("BlockStored") if e.session_id == session
                for h in e.block_hashes}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


def wait_for(predicate, timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_kv_events_stay_true_with_pins(cluster):
    """Pinned blocks are never reported removed while pinned; a released pin's
    blocks are reported removed when vLLM evicts them, not when released;
    a reset clears everything (AllBlocksCleared)."""
    instance = cluster.servers[0]
    url = instance.base_url
    sub = Subscriber(instance.kv_events_endpoint)
    client = OpenAI(base_url=f"{url}/v1", api_key="x", timeout=120, max_retries=0)
    # Cycling traffic: twice the pool in distinct blocks per round.
    cycle = {"requests": 2 * NUM_BLOCKS * BLOCK_SIZE // 1024 + 1, "tokens": 1024, "vocab": 2000}
    try:
        time.sleep(0.5)  # the SUB socket joins the publisher
        session = "kv-events-A"
        messages = [{"role": "system", "content": "You are a travel agent."},
                    {"role": "user", "content": "Weather in the first city of my trip?"}]
        first, _, _ = _ask(client, messages, session, last=False, seed=5, model="tiny")
        wait_for(lambda: sub.stored_by(session), what="BlockStored of the pinned turn")
        pinned = set(sub.stored_by(session))
        assert len(pinned) >= first.usage.prompt_tokens // BLOCK_SIZE

        # The side channel names the pin and its expiry (KV events cannot).
        from vllm_continuum.cluster.pins_endpoint import session_sha256

        listing = httpx.get(f"{url}/continuum/pins", timeout=10).json()
        mine = [p for p in listing["pins"] if p["session_sha256"] == session_sha256(session)]
        assert len(mine) == 1 and mine[0]["blocks"] >= len(pinned) - 2, listing
        assert 0 < mine[0]["expires_in_s"] <= float(SETTINGS["default_ttl_s"])

        # While pinned: the pool cycles (evictions are reported), never ours.
        t0 = time.monotonic()
        churn(client, seed=11, **cycle)
        wait_for(lambda: len(sub.removed(t0)) > NUM_BLOCKS // 2, what="evictions")
        assert not pinned & sub.removed(), "a pinned block was reported removed"

        # Release without evicting: the session's next turn takes the blocks
        # over and, as a last turn, frees them (cached, evictable). Nothing of
        # ours is reported removed by the release itself.
        call = first.choices[0].message.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call.id, "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
        ]
        last, _, _ = _ask(client, messages, session, last=True, seed=6, model="tiny")
        assert (last.usage.prompt_tokens_details.cached_tokens or 0) >= (
            first.usage.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE)
        t_released = time.monotonic()
        time.sleep(1.0)
        assert not pinned & sub.removed(), "released blocks reported removed before eviction"

        # Now vLLM evicts them (LRU) as the pool cycles again: reported removed.
        churn(client, seed=12, **cycle)
        wait_for(lambda: pinned <= sub.removed(t_released), what="the released blocks' removal")

        # Reset: pins are released first (a held block would fail the reset),
        # and the publisher reports AllBlocksCleared at the next step.
        _ask(client, messages[:2], "kv-events-B", last=False, seed=7, model="tiny")
        t_reset = time.monotonic()
        reset = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
        assert reset.status_code == 200 and reset.json()["success"] is True
        churn(client, seed=13, requests=1, tokens=64, vocab=2000)  # one step flushes events
        wait_for(lambda: sub.of("AllBlocksCleared", t_reset), what="AllBlocksCleared")
        counters = continuum_counters(url)
        assert counters.get("continuum_pin_releases_total{reason=reset}", 0) >= 1
    finally:
        sub.close()


# ------------------------------------------------------------------ DP ranks


def engine_successes(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:request_success_total":
                out[s.labels["engine"]] += s.value
    return out


def test_dp_ranks_keep_a_session_on_one_engine(dp_server_started):
    """The CPU build runs --data-parallel-size 2. A session's turns land on
    rank_for_session(session, 2) (the front end's choice, by the plugin);
    requests without a session are balanced by vLLM over both engines."""
    server = dp_server_started.wait_ready(timeout_s=420)
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="x", timeout=120, max_retries=0)

    def served_by(send) -> tuple[str, object]:
        before = engine_successes(server.base_url)
        response = send()
        deadline = time.monotonic() + 10
        while True:
            after = engine_successes(server.base_url)
            moved = [e for e in after if after[e] > before.get(e, 0)]
            if moved or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(moved) == 1, (before, after)
        return moved[0], response

    ranks_used = set()
    for k in range(6):
        session = f"dp-session-{k}"
        expected = str(rank_for_session(session, 2))
        messages = [{"role": "system", "content": "You are a travel agent."},
                    {"role": "user", "content": f"Trip {k}: weather in the first city?"}]
        prev_prompt = None
        for turn in range(3):
            last = turn == 2
            engine, (response, _, _) = served_by(
                lambda: _ask(client, messages, session, last=last, seed=k * 10 + turn,
                             model="tiny"))
            assert engine == expected, f"{session} turn {turn} on engine {engine}"
            ranks_used.add(engine)
            if prev_prompt is not None:  # the pin on this rank held the history
                cached = response.usage.prompt_tokens_details.cached_tokens or 0
                assert cached >= prev_prompt // BLOCK_SIZE * BLOCK_SIZE
            prev_prompt = response.usage.prompt_tokens
            if not last:
                call = response.choices[0].message.tool_calls[0]
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": call.id, "type": "function", "function": {
                            "name": call.function.name, "arguments": call.function.arguments}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
                ]
    assert ranks_used == {"0", "1"}  # six sessions hash to both ranks
    # Without a session, vLLM's own balancer still spreads the load.
    anonymous = {served_by(lambda: client.completions.create(
        model="tiny", prompt=f"hello {i}", max_tokens=2))[0] for i in range(6)}
    assert anonymous == {"0", "1"}
