"""Pin metrics end to end: real vLLM servers with the plugin (tiny model),
scraped by a real Prometheus (Debian's `prometheus`, on loopback), checked
through Prometheus's HTTP API.

Two continuum servers: the session's single-API-server one (`live_servers`)
and one with `--api-server-count 2` (vLLM's multiprocess metrics mode),
started through `vllm serve` (`vllm_continuum.adapter.launch`). Each runs the pause
scenario and the idle-expiry scenario; the dashboard's PromQL is evaluated
against what Prometheus collected.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from vllm_continuum.config import additional_config_arg
from vllm_continuum.demos.pause_demo import DEMO_SETTINGS
from vllm_continuum.demos.pause_scenario import run_pause_scenario
from vllm_continuum.metrics.snapshot import EXPIRY_GRACE_S
from vllm_continuum.tools.local_server import (
    BLOCK_SIZE, CPU_SERVER_FLAGS, VLLMServer, free_port, stop_process_group,
)

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "vllm-continuum.json"
TTL_S = float(DEMO_SETTINGS["default_ttl_s"])  # live_servers' fixed TTL; ours too
SCRAPE_S = 1.0
JOBS = ("single", "two_api")
REASONS = ("resumed", "expired", "pressure", "last_turn", "aborted", "reset", "replaced")
# Panels whose queries must return series once the scenarios have run.
CORE_PANELS = {
    "Pinned KV blocks vs vLLM KV usage",
    "Pin outcomes by reason",
    "Session turns: tool calls by format, answers",
    "Resume hit rate",
    "Reuse ratio of resumed turns",
    "TTL distribution",
    "Tool duration distribution",
    "Time to first token (vLLM)",
    "Pinned sessions and blocks",
}


class CliServer(VLLMServer):
    """`vllm serve` (vLLM's own CLI): the only entry point with --api-server-count."""

    @property
    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm_continuum.adapter.launch", "serve", self.model,
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
            *self.args,
        ]


@pytest.fixture(scope="session")
def two_api_started(tiny_model_dir, tmp_path_factory):
    """Started, not waited for: it boots while `live_servers` boots."""
    num_blocks = 64
    args = [
        *CPU_SERVER_FLAGS,
        "--num-gpu-blocks-override", str(num_blocks),
        "--max-model-len", str((num_blocks - 1) * BLOCK_SIZE),
        "--scheduler-cls", "continuum",
        "--api-server-count", "2",
        *additional_config_arg(DEMO_SETTINGS),
    ]
    log = tmp_path_factory.mktemp("server-logs-metrics") / "two_api.log"
    server = CliServer(tiny_model_dir, args, log_path=log, name="two_api")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def servers(two_api_started, live_servers) -> dict[str, VLLMServer]:
    two_api_started.wait_ready(timeout_s=420)
    return {"single": live_servers["continuum"], "two_api": two_api_started}


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def settle(self, job: str) -> None:
        """Wait for a scrape of `job` that started after now (the engine's
        idle snapshot is written as its last request finishes)."""
        after = time.time() + 0.2
        deadline = after + 30
        while time.time() < deadline:
            last = self.value(f'timestamp(up{{job="{job}"}})')
            if last is not None and last > after:
                return
            time.sleep(0.2)
        raise TimeoutError(f"Prometheus did not scrape {job} within 30 s")

    def quiesce(self, job: str) -> None:
        """Settle, and wait out pins left by earlier tests on a shared server
        (their TTL passes with no traffic), so that deltas are ours alone."""
        deadline = time.time() + TTL_S + EXPIRY_GRACE_S + 15
        while True:
            self.settle(job)
            if self.value(f'sum(continuum_pinned_sessions{{job="{job}"}})') == 0:
                return
            assert time.time() < deadline, f"pins on {job} never expired"
            time.sleep(1)

    def state(self, job: str) -> dict[str, float]:
        """Every continuum figure of one server, as Prometheus holds it now."""
        sel = f'job="{job}"'
        state: dict[str, float] = {}
        for reason in REASONS:
            state[f"release:{reason}"] = self.value(
                f'sum(continuum_pin_releases_total{{{sel},reason="{reason}"}})')
        for outcome in ("pinned", "unpinned"):
            state[f"resume:{outcome}"] = self.value(
                f'sum(continuum_resumes_total{{{sel},outcome="{outcome}"}})')
        # Session turns: answers exist from start-up (at 0), calls once one was recognised.
        state["turns:answer"] = self.value(
            f'sum(continuum_session_turns_total{{{sel},outcome="answer",format="none"}})')
        state["turns:hermes"] = self.value(
            f'sum(continuum_session_turns_total{{{sel},outcome="tool_call",format="hermes"}}) '
            "or vector(0)")
        for name in (
            "continuum_pins_total", "continuum_resume_prompt_tokens_total",
            "continuum_resume_cached_tokens_total", "continuum_invalid_hints_total",
            "continuum_pinned_blocks", "continuum_pinned_sessions",
            "continuum_ttl_seconds_count", "continuum_ttl_seconds_sum",
            "continuum_tool_duration_seconds_count", "continuum_pin_held_seconds_count",
            "continuum_pin_held_seconds_sum",
        ):
            state[name] = self.value(f"sum({name}{{{sel}}}) or vector(0)")
        # Exported from start-up (at 0): absent from Prometheus is a failure.
        state["continuum_block_shortages_total"] = self.value(
            f"sum(continuum_block_shortages_total{{{sel}}})")
        missing = [k for k, v in state.items() if v is None]
        assert not missing, f"not in Prometheus for {job}: {missing}"
        return state


@pytest.fixture(scope="module")
def prometheus(servers, tmp_path_factory):
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("Prometheus is not installed: run scripts/setup.sh (Debian package `prometheus`)")
    home = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S:g}s", "evaluation_interval": "5s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [s.base_url.removeprefix("http://")]}]}
            for job, s in servers.items()
        ],
    }
    (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = open(home / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            exe, f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, (home / "prometheus.log").read_text()[-3000:]
            try:
                if all(prom.value(f'up{{job="{job}"}}') == 1 for job in servers):
                    break
            except (httpx.HTTPError, AssertionError, KeyError, ValueError):
                pass
            assert time.time() < deadline, "Prometheus never scraped both servers"
            time.sleep(0.5)
        yield prom
    finally:
        stop_process_group(proc, timeout_s=30)
        log.close()


def direct_scrape(server: VLLMServer) -> dict[tuple, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def delta(after: dict, before: dict) -> dict[str, float]:
    return {k: round(after[k] - before[k], 6) for k in after}


# ------------------------------------------------------------------ the pause
@pytest.mark.parametrize("job", JOBS)
def test_pause_scenario_moves_the_counters_it_should(servers, prometheus, job):
    server = servers[job]
    prometheus.quiesce(job)
    before = prometheus.state(job)
    # A session id of its own (the flavour string), the well-trodden seed.
    result = run_pause_scenario(server.base_url, f"metrics-{job}", seed=0)
    assert result.tool_called == "get_weather"
    prometheus.settle(job)
    d = delta(prometheus.state(job), before)

    assert d["continuum_pins_total"] == 1
    # Its first turn's call was recognised in the output (Hermes' <tool_call>), its
    # second turn answered.
    assert (d["turns:hermes"], d["turns:answer"]) == (1, 1)
    assert {r: d[f"release:{r}"] for r in REASONS} == {r: int(r == "resumed") for r in REASONS}
    assert (d["resume:pinned"], d["resume:unpinned"]) == (1, 0)
    # The engine's figures are the ones the client saw in `usage`.
    assert d["continuum_resume_prompt_tokens_total"] == result.turn2_prompt_tokens
    assert d["continuum_resume_cached_tokens_total"] == result.turn2_cached_tokens
    assert d["continuum_resume_cached_tokens_total"] > 0
    assert (d["continuum_ttl_seconds_count"], d["continuum_ttl_seconds_sum"]) == (1, TTL_S)
    assert d["continuum_tool_duration_seconds_count"] == 1
    assert d["continuum_pin_held_seconds_count"] == 1
    assert 0 < d["continuum_pin_held_seconds_sum"] < TTL_S  # resumed before its TTL
    assert d["continuum_invalid_hints_total"] == 0
    assert prometheus.value(f'sum(continuum_pinned_sessions{{job="{job}"}})') == 0


# ------------------------------------------------------------------ idle expiry
@pytest.mark.parametrize("job", JOBS)
def test_pin_that_expires_while_the_engine_sleeps_is_not_reported_pinned(
    servers, prometheus, job
):
    server = servers[job]
    ttl = 4.0
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="-", timeout=120, max_retries=0)
    prometheus.quiesce(job)
    before = prometheus.state(job)

    client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Run the slow tool. " + "data " * 80}],
        max_tokens=2,
        extra_body={
            "session_id": f"idle-{job}",
            "vllm_xargs": {"continuum_tool": "sleep", "continuum_ttl_s": ttl},
        },
    )
    pinned_at = time.monotonic()
    prometheus.settle(job)
    assert time.monotonic() - pinned_at < ttl, "too slow to see the pin before its TTL"
    fresh = delta(prometheus.state(job), before)
    assert fresh["continuum_pins_total"] == 1
    assert fresh["continuum_pinned_sessions"] == 1 and fresh["continuum_pinned_blocks"] > 0

    # No traffic at all: the engine core does not step, only Prometheus scrapes.
    time.sleep(max(0.0, pinned_at + ttl + EXPIRY_GRACE_S + 0.2 - time.monotonic()))
    prometheus.settle(job)
    idle = prometheus.state(job)
    shown = delta(idle, before)
    assert idle["continuum_pinned_sessions"] == 0 and idle["continuum_pinned_blocks"] == 0
    assert shown["release:expired"] == 1
    assert shown["continuum_pin_held_seconds_count"] == 1
    assert shown["continuum_pin_held_seconds_sum"] == pytest.approx(ttl, abs=0.2)
    direct = direct_scrape(server)
    assert direct[("continuum_pinned_sessions", (("model_name", "tiny"),))] == 0

    # New work wakes the engine, which now expires the pin itself: the same
    # figures, nothing counted twice.
    client.completions.create(model="tiny", prompt="wake up", max_tokens=1)
    prometheus.settle(job)
    woken = delta(prometheus.state(job), before)
    for key in ("release:expired", "continuum_pin_held_seconds_count", "continuum_pins_total"):
        assert woken[key] == shown[key], key
    assert woken["continuum_pin_held_seconds_sum"] == pytest.approx(
        shown["continuum_pin_held_seconds_sum"]
    )
    assert sum(woken[f"release:{r}"] for r in REASONS) == 1


# ------------------------------------------------------------- api-server-count 2
def test_every_api_server_process_reports_the_same_figures(servers):
    """Each scrape is answered by one of the two API-server processes (new
    connection each time); all must carry the same continuum figures."""
    seen = set()
    for _ in range(20):
        samples = direct_scrape(servers["two_api"])
        ours = tuple(sorted((k, v) for k, v in samples.items() if k[0].startswith("continuum_")))
        assert any(k[0] == "continuum_pinned_blocks" for k, _ in ours)
        assert any(k[0].startswith("vllm:") for k in samples)
        seen.add(ours)
    assert len(seen) == 1


def test_vllm_own_metrics_are_unchanged(live_servers):
    def families(server):
        text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        return {f.name for f in text_string_to_metric_families(text)}

    stock, continuum = families(live_servers["stock"]), families(live_servers["continuum"])
    assert "continuum_pin_releases" in continuum
    assert not any(n.startswith("continuum_") for n in stock)  # plugin loaded, scheduler stock
    # Everything but ours and the HTTP middleware's per-handler series (which
    # depend on the traffic each server has had) is the same.
    def vllm_own(names):
        return {n for n in names if not n.startswith(("continuum_", "http_"))}

    assert vllm_own(continuum) == vllm_own(stock)
    assert any(n.startswith("vllm:") for n in stock)


# ------------------------------------------------------------------ the dashboard
def _targets():
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_every_dashboard_expression_evaluates_and_core_panels_have_data(servers, prometheus):
    assert {title for title, _ in _targets()} >= CORE_PANELS
    values = {
        "$model_name": "tiny", "$instance": ".*", "$__rate_interval": "10m", "$__range": "1h",
    }
    empty = []
    for title, expr in _targets():
        concrete = expr
        for var, value in values.items():
            concrete = concrete.replace(var, value)
        assert "$" not in concrete, f"unsubstituted variable in {title}: {expr}"
        result = prometheus.query(concrete)  # raises on a PromQL error
        if title in CORE_PANELS and not result:
            empty.append((title, concrete))
        for series in result:
            if title in ("Resume hit rate", "Reuse ratio of resumed turns") and "continuum" in concrete:
                v = float(series["value"][1])
                assert math.isfinite(v) and 0 < v <= 1, (title, v)
    assert not empty, empty
    names = httpx.get(
        f"{prometheus.url}/api/v1/label/model_name/values",
        params={"match[]": "continuum_pinned_blocks"}, timeout=10,
    ).json()["data"]
    assert names == ["tiny"]  # the dashboard's model_name variable query


def test_server_logs_show_no_crash(servers):
    for server in servers.values():
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, server.log_tail(60)
        assert not re.search(r"EngineCore.*(died|failed)|EngineDeadError", log), server.log_tail(60)
        assert "continuum metrics:" not in log  # no exporter warning
