"""The TTL model on a real server: `vllm-continuum profile` measures the
prefill cost, and after tools with short and long durations were observed
past K, the short tool's turns are pinned and the long tool's are not."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from openai import OpenAI

from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.demos.pause_scenario import city_tool
from vllm_continuum.tools.local_server import flavour_server
from vllm_continuum.tools.prefill_probe import measure, report

pytestmark = pytest.mark.engine

K = 3


TOOLS = [city_tool("lookup", "Look a city up."), city_tool("crawl", "Crawl a city's pages.")]


@pytest.fixture(scope="module")
def profile_path(live_servers, tmp_path_factory):
    profile = measure(live_servers["stock"].base_url, lengths=[128, 512, 1024, 1536], repeats=2)
    print(report(profile))
    path = tmp_path_factory.mktemp("profile") / "prefill_profile.yaml"
    profile.save(path)
    return path


@pytest.fixture(scope="module")
def slow_reload_profile(tmp_path_factory):
    """The TTL test's reload cost: that of a model far slower to prefill than
    the tiny one (0.7 s for 1,000 tokens). With the tiny model's measured
    profile, the reload (tens of ms) is of the order of the API's own
    overhead between two turns, which the short tool's measured durations
    include: whether it is worth pinning was then a race on a loaded machine."""
    path = tmp_path_factory.mktemp("slow-profile") / "prefill_profile.yaml"
    PrefillProfile(0.2, 5e-4, 0.0, source="synthetic: a slow model's reload cost").save(path)
    return path


@pytest.fixture(scope="module")
def model_server(tiny_model_dir, slow_reload_profile, tmp_path_factory):
    settings = {
        "ttl_policy": "continuum",
        "pin_cost": "always",  # the paper's Eq. 2: its decisions are what is checked
        "cold_start_samples": K,
        "prefill_profile": str(slow_reload_profile),
        "log_level": "DEBUG",
    }
    server = flavour_server(
        "continuum", tiny_model_dir, tmp_path_factory.mktemp("model-server"), settings=settings
    )
    with server:
        yield server


def test_profile_is_written_with_its_fit(profile_path):
    """The profile's figures are timings on a shared machine: how good the fit
    is gets printed and saved, not asserted (timing targets belong in
    benchmarks)."""
    profile = PrefillProfile.load(profile_path)
    assert len(profile.points) == 8
    assert {n for n, _ in profile.points} == {128, 512, 1024, 1536}
    assert all(t > 0 for _, t in profile.points)
    saved = yaml.safe_load(profile_path.read_text())
    assert {"fit_rmse_s", "fit_mean_relative_error", "c0", "c1", "c2"} <= saved.keys()


def session(client: OpenAI, name: str, tool_name: str, pause_s: float, words: int) -> None:
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Look into this: " + " ".join(["city weather report"] * words)},
    ]
    first = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=64, seed=1,
        tool_choice={"type": "function", "function": {"name": tool_name}},
        extra_body={"session_id": name},
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == tool_name
    if pause_s < 0:
        return  # a probe: only the TTL decision of its first turn matters
    time.sleep(pause_s)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": "ok"},
    ]
    client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4,
        extra_body={"session_id": name, "vllm_xargs": {"continuum_last_turn": 1}},
    )


def test_short_tools_get_a_ttl_and_long_ones_do_not(model_server, slow_reload_profile):
    profile = PrefillProfile.load(slow_reload_profile)
    words = 300  # a context whose reload costs far more than the short tool takes
    client = OpenAI(base_url=f"{model_server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    long_pause = 4 * profile.seconds(2000) + 1.0  # dwarfs any reload benefit here
    with ThreadPoolExecutor(max_workers=K + 1) as pool:
        crawls = [
            pool.submit(session, client, f"crawl-{i}", "crawl", long_pause, words)
            for i in range(K + 1)
        ]
        for i in range(K + 1):
            session(client, f"lookup-{i}", "lookup", 0.0, words)
        for crawl in crawls:
            crawl.result()
    session(client, "probe-lookup", "lookup", -1, words)
    session(client, "probe-crawl", "crawl", -1, words)

    log = model_server.log_path.read_text()
    decisions = dict(
        (m.group(1), (float(m.group(2)), m.group(3)))
        for m in re.finditer(r"continuum: session=(probe-\w+) tool=\w+ ttl=([\d.]+)s source=(.+)", log)
    )
    assert decisions["probe-lookup"][1] == "tool CDF" and decisions["probe-lookup"][0] > 0, log[-3000:]
    assert decisions["probe-crawl"] == (0.0, "tool CDF"), log[-3000:]
    assert "Traceback" not in log
