"""`vllm-continuum cluster` without starting anything: the commands it builds
and its argument handling (the live behaviour is tests/engine/test_engine_cluster.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_continuum.cli import main
from vllm_continuum.cluster.local_cluster import Cluster, Instance, Router, kv_events_config, router_executable


def test_router_command_for_kv_aware_names_every_event_source():
    r = Router(["http://127.0.0.1:1", "http://127.0.0.1:2"], "kv_aware",
               {"http://127.0.0.1:1": "tcp://127.0.0.1:7001", "http://127.0.0.1:2": "tcp://127.0.0.1:7002"},
               kv_event_block_size=32, kv_event_model="tiny", extra_args=["--log-level", "debug"], port=9)
    cmd = r.command
    assert cmd[0] == router_executable()
    assert cmd[cmd.index("--policy") + 1] == "kv_aware"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert "http://127.0.0.1:1=tcp://127.0.0.1:7001" in cmd and "http://127.0.0.1:2=tcp://127.0.0.1:7002" in cmd
    assert cmd[cmd.index("--kv-event-model") + 1] == "tiny"
    assert cmd[cmd.index("--kv-event-block-size") + 1] == "32"
    assert cmd[-2:] == ["--log-level", "debug"]
    # Other policies get no KV-event flags (vllm-router would refuse them).
    assert "--kv-event-source" not in Router(["http://x"], "consistent_hash", {"http://x": "tcp://y"}).command


def test_instance_command_runs_continuum_with_events_and_the_instance_header(tmp_path):
    c = Cluster("MODEL", 2, tmp_path, ["--block-size", "32", "--served-model-name", "m"], base_port=8100)
    assert c.model_name == "m"
    i = Instance("MODEL", ["--scheduler-cls", "continuum"], port=8101)
    i.kv_events_endpoint = f"ipc://{tmp_path}/kv.sock"
    cmd = i.command
    assert cmd[cmd.index("--port") + 1] == "8101" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    middleware = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--middleware"]
    assert middleware == ["vllm_continuum.cluster.instance_header.InstanceHeaderMiddleware",
                          "vllm_continuum.cluster.pins_endpoint.PinsEndpoint"]
    events = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    assert events == json.loads(kv_events_config(f"ipc://{tmp_path}/kv.sock"))
    assert events["publisher"] == "zmq" and events["enable_kv_cache_events"] is True
    assert cmd[-2:] == ["--scheduler-cls", "continuum"]


def test_cli_refuses_kv_aware_without_events_and_zero_instances():
    with pytest.raises(SystemExit, match="KV events"):
        main(["cluster", "MODEL", "--policy", "kv_aware", "--no-kv-events"])
    with pytest.raises(SystemExit, match="at least 1"):
        main(["cluster", "MODEL", "--instances", "0"])


def test_instance_header_middleware_names_the_instance(monkeypatch):
    import asyncio

    from vllm_continuum.cluster.instance_header import InstanceHeaderMiddleware

    monkeypatch.setenv("CONTINUUM_INSTANCE", "node-3")
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})

    async def send(message):
        sent.append(message)

    asyncio.run(InstanceHeaderMiddleware(app)({"type": "http"}, None, send))
    assert (b"x-continuum-instance", b"node-3") in sent[0]["headers"]


def test_prometheus_config_scrapes_every_instance():
    """configs/prometheus.yml is valid for Prometheus's own checker and has a
    job with one target per instance of the `cluster` command's defaults."""
    import shutil
    import subprocess

    import yaml

    path = Path(__file__).resolve().parents[2] / "configs" / "prometheus.yml"
    config = yaml.safe_load(path.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["vllm"]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert jobs["vllm-cluster"]["static_configs"][0]["targets"] == ["127.0.0.1:8100", "127.0.0.1:8101"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/setup.sh installs Debian's prometheus)")
    run = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_pins_side_channel_lists_live_pins_by_session_digest(tmp_path):
    """GET /continuum/pins: what the engines' snapshots say, judged now."""
    import asyncio

    from vllm_continuum.metrics.snapshot import SnapshotWriter, session_digest
    from vllm_continuum.cluster.pins_endpoint import PinsEndpoint, live_pins, session_sha256

    assert session_sha256("agent-42") == session_digest("agent-42")
    long_id = "x" * 300  # keyed in the engine by its SHA-256 (scheduler.mixin.session_key)
    import hashlib
    key = "sha256:" + hashlib.sha256(long_id.encode()).hexdigest()
    assert session_digest(key) == session_sha256(long_id)

    now = 1000.0
    SnapshotWriter(tmp_path).write({"format": 1, "mono": now - 5, "idle": True, "pins": [
        [10, 20.0, 30.0, False, "a" * 32],  # 15 s left now
        [4, 2.0, 30.0, False, "b" * 32],  # expired while idle (3 s ago > grace)
        [6, 2.0, 30.0, True, "c" * 32],  # past its TTL but held for a queued turn
        [3, 9.0, 9.0, False],  # an older snapshot format: not named, skipped
    ]})
    listing = live_pins(str(tmp_path), now=now)
    assert listing["engines"] == 1
    assert [(p["session_sha256"][0], p["blocks"], p["expires_in_s"], p["held"])
            for p in listing["pins"]] == [("c", 6, 0.0, True), ("a", 10, 15.0, False)]
    assert live_pins(None) == {"engines": 0, "pins": []}

    sent = []

    async def app(scope, receive, send):
        sent.append("passed through")

    async def send(message):
        sent.append(message)

    async def call(path, method="GET"):
        await PinsEndpoint(app)({"type": "http", "path": path, "method": method}, None, send)

    asyncio.run(call("/v1/models"))
    assert sent == ["passed through"]
    sent.clear()
    asyncio.run(call("/continuum/pins"))
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"engines": 0, "pins": []}
    sent.clear()
    asyncio.run(call("/continuum/pins", "POST"))
    assert sent[0]["status"] == 405
