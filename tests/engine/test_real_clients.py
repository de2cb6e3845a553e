"""The real agent clients, unmodified, against live servers (tiny model, CPU).

Claude Code (`claude -p`), Codex CLI (`codex exec`, the Responses API) and
LiteLLM (`hosted_vllm/`, the conversation id as `prompt_cache_key`, as the
OpenHands SDK sends it) are given only the server's URL, a dummy key and
the model name; their telemetry and update checks are off, they run in a
throwaway home and working directory, and the whole file runs inside a
loopback-only network namespace (`scripts/test.sh` runs it under
`unshare -n`; elsewhere it skips): nothing can leave the machine.

Both servers carry the test-only hook `force_tool_call.ForceToolCall`,
which makes the random-weight model's first turn call one of the tools the
client offered (a forced `tool_choice`; it adds no continuum hint) and holds
the client's next turn while the test cycles the KV pool (the tool pause).
The continuum server also runs the plugin's `ClientSessionMiddleware`, inside
the hook. For each client: its session is recognised from its own spelling
(`GET /continuum/pins` lists it, the metrics count the spelling), its
tool-call turn is pinned (recognised by the plugin itself: the call in the
output, or the forced `tool_choice` the middleware reads), and its next turn
finds every full block of that turn's prompt cached on continuum, not on stock.

A third server serves the tiny model built as Kimi K2 (its tokens and chat
template) with vLLM's `--tool-call-parser kimi_k2` and no continuum setting;
a test-only logits processor (scripted_tool_calls.py) makes it write Kimi
K2's own tool-call text. The OpenAI SDK and Codex receive `tool_calls` parsed
by vLLM, run the tool and answer; the scheduler pins the call from Kimi's
markers in the vocabulary, with no hint from any hook.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.conftest import serving
from tests.engine.scripted_tool_calls import ANSWER
from tests.engine.test_client_sessions_live import pinned, sessions_counted
from vllm_continuum.demos.pause_scenario import churn, filler_text
from vllm_continuum.tools.local_server import flavour_server

ROOT = Path(__file__).parents[2]
CLAUDE = ROOT / ".clients/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
CODEX = ROOT / ".clients/node_modules/.bin/codex"
LITELLM_PYTHON = ROOT / ".venv-clients/bin/python"
BLOCK, NUM_BLOCKS = 32, 1400  # Claude Code's first prompt is about 36,000 tokens
PLUGIN = ["--middleware", "vllm_continuum.frontend.middleware.ClientSessionMiddleware",
          "--middleware", "vllm_continuum.cluster.pins_endpoint.PinsEndpoint"]
TASK = "List the files in this directory and say what the project does."


def isolated() -> bool:
    """Whether this process's network namespace has nothing but loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not isolated(), reason="runs the real clients only inside a "
                       "loopback-only network namespace: scripts/test.sh runs it under unshare -n"),
]


@pytest.fixture(scope="module")
def real_servers(tiny_model_dir, kimi_model_dir, tmp_path_factory):
    """Stock and continuum, both with the test hook, long context, one pool size;
    and continuum serving the Kimi K2 tiny model (its own parser, no setting)."""
    work = tmp_path_factory.mktemp("real-clients")
    # The last --middleware is the outermost: the hook forces the tool choice
    # before the plugin's middleware reads the request.
    hook = ["--middleware", "tests.engine.force_tool_call.ForceToolCall"]
    servers = {}
    for flavour in ("stock", "continuum"):
        env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
               "FORCE_TOOL_CALL_GATE": str(work / f"gate-{flavour}"),
               "FORCE_TOOL_CALL_LOG": str(work / f"usage-{flavour}.jsonl")}
        servers[flavour] = flavour_server(
            flavour, tiny_model_dir, work, num_blocks=NUM_BLOCKS, env=env,
            settings={"max_ttl_s": 300, "log_level": "DEBUG"} if flavour == "continuum" else None,
            extra_args=[*(PLUGIN if flavour == "continuum" else ()), *hook,
                        "--max-model-len", str((NUM_BLOCKS - 1) * BLOCK)])
    env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "FORCE_TOOL_CALL_STEER": "0",
           "FORCE_TOOL_CALL_GATE": str(work / "gate-kimi"),
           "FORCE_TOOL_CALL_LOG": str(work / "usage-kimi.jsonl")}
    servers["kimi"] = flavour_server(
        "continuum", kimi_model_dir, work / "kimi", num_blocks=NUM_BLOCKS, env=env,
        settings={"max_ttl_s": 300, "log_level": "DEBUG"},
        extra_args=["--tool-call-parser", "kimi_k2", "--logits-processors",
                    "tests.engine.scripted_tool_calls:ScriptedToolCalls", *PLUGIN, *hook,
                    "--max-model-len", str((NUM_BLOCKS - 1) * BLOCK)])
    with serving(servers):
        yield servers


def gate(server) -> Path:
    return Path(server.env["FORCE_TOOL_CALL_GATE"])


def usage_rows(server, session: str) -> list[dict]:
    log = Path(server.env["FORCE_TOOL_CALL_LOG"])
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [r for r in rows if r["session"] == session]


def cycle_pool(base_url: str, seed: int) -> None:
    """Other users' traffic: more distinct tokens than the whole KV pool."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=300, max_retries=0)
    churn(client, requests=NUM_BLOCKS * BLOCK // 4000 + 2, tokens=4000, vocab=2000, seed=seed)


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the client exited ({process.returncode}) before its next turn:"
                                 f"\n{process.stdout.read() if process.stdout else ''}")
        assert time.monotonic() < deadline, f"no next turn after {timeout_s:.0f} s"
        time.sleep(0.2)


def scratch(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "README.md").write_text("A throwaway directory for an agent client test.\n")
    return home, work


def check(flavour, server, source, session, first, resumed):
    full_blocks = first["prompt"] // BLOCK * BLOCK
    assert first["prompt"] >= 10 * BLOCK
    if flavour == "continuum":
        assert sessions_counted(server.base_url, source) >= 2
        assert resumed["cached"] >= full_blocks, (first, resumed)
    else:
        assert resumed["cached"] < full_blocks, (first, resumed)


def run_client(server, flavour, source, *, seed, command, cwd, env):
    """Run a client until its tool-call turn is held at the gate; check the pin
    (continuum), cycle the pool, let its next turn through, then check that the
    next turn found the first turn's full blocks cached (continuum) or not (stock)."""
    gate(server).touch()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(Path(f"{gate(server)}.waiting"), process)
        session = json.loads(Path(server.env["FORCE_TOOL_CALL_LOG"]).read_text()
                             .splitlines()[-1])["session"]
        if flavour == "continuum":
            assert pinned(server.base_url, session) is not None, "the tool-call turn was not pinned"
        cycle_pool(server.base_url, seed=seed)
    finally:
        gate(server).unlink()
        Path(f"{gate(server)}.waiting").unlink(missing_ok=True)
        output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    rows = usage_rows(server, session)
    resumed = next((r for r in rows if r["later"]), None)
    assert resumed is not None, f"no request of session {session} after the gate: {rows}\n{output[-3000:]}"
    first = rows[0]
    check(flavour, server, source, session, first, resumed)


def codex(server, tmp_path) -> dict:
    """`codex exec` against `server`, in a throwaway home: run_client's arguments."""
    home, work = scratch(tmp_path)
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "tiny"\nmodel_provider = "local"\ncheck_for_update_on_startup = false\n\n'
        f'[model_providers.local]\nname = "local"\nbase_url = "{server.base_url}/v1"\n'
        'wire_api = "responses"\nenv_key = "LOCAL_API_KEY"\n\n[analytics]\nenabled = false\n')
    return dict(cwd=work, command=[str(CODEX), "exec", "--skip-git-repo-check", "--sandbox",
                                   "read-only", TASK],
                env={"PATH": os.environ["PATH"], "HOME": str(home),
                     "CODEX_HOME": str(codex_home), "LOCAL_API_KEY": "dummy"})


@pytest.mark.skipif(not CODEX.exists(), reason="Codex CLI not installed (scripts/setup.sh)")
@pytest.mark.parametrize("flavour", ["continuum", "stock"])
def test_codex_exec(real_servers, flavour, tmp_path):
    server = real_servers[flavour]
    run_client(server, flavour, "header:session-id", seed=3, **codex(server, tmp_path))


@pytest.mark.skipif(not CLAUDE.exists(), reason="Claude Code not installed (scripts/setup.sh)")
@pytest.mark.parametrize("flavour", ["continuum", "stock"])
def test_claude_code_print_mode(real_servers, flavour, tmp_path):
    server = real_servers[flavour]
    home, work = scratch(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": str(home),
           "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "dummy",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    run_client(server, flavour, "header:x-claude-code-session-id", seed=4, cwd=work, env=env,
               command=[str(CLAUDE), "-p", TASK, "--model", "tiny", "--permission-mode", "default"])


@pytest.mark.skipif(not LITELLM_PYTHON.exists(), reason="LiteLLM not installed (scripts/setup.sh)")
@pytest.mark.parametrize("flavour", ["continuum", "stock"])
def test_litellm_hosted_vllm(real_servers, flavour, tmp_path):
    import random

    server = real_servers[flavour]
    session = f"conversation-{uuid.uuid4()}"
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([
        {"role": "system", "content": "You are a travel agent. Use tools to check the weather."},
        {"role": "user", "content": filler_text(random.Random(5), 300) + "\nWeather?"}]))
    gate(server).touch()
    process = subprocess.Popen(
        [str(LITELLM_PYTHON), str(Path(__file__).with_name("litellm_agent.py")),
         server.base_url, session, str(gate(server)), str(messages)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
             "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"})
    try:
        wait_for(Path(f"{gate(server)}.waiting"), process)
        if flavour == "continuum":
            assert pinned(server.base_url, session) is not None, "the tool-call turn was not pinned"
        cycle_pool(server.base_url, seed=5)
    finally:
        gate(server).unlink()
        Path(f"{gate(server)}.waiting").unlink(missing_ok=True)
        output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    turns = [json.loads(line) for line in output.splitlines() if line.startswith('{"turn"')]
    assert turns[0]["tool"] == "get_weather"
    check(flavour, server, "body:prompt_cache_key", session, turns[0], turns[1])


# --- Kimi K2: its own tool-call format, through vLLM's kimi_k2 parser ----------

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def turns_counted(base_url: str, call_format: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    found = re.search(r'^continuum_session_turns_total\{[^}]*format="%s"[^}]*outcome="tool_call"'
                      r'[^}]*\} (\S+)$' % re.escape(call_format), text, re.M)
    return float(found.group(1)) if found else 0.0


def test_kimi_k2_calls_reach_the_openai_sdk_are_pinned_and_resumed(real_servers):
    import random

    server = real_servers["kimi"]
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=300, max_retries=0)
    session = f"kimi-{uuid.uuid4()}"
    messages = [{"role": "user", "content": filler_text(random.Random(6), 300) + "\nWeather in Paris?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=WEATHER,
                                           max_tokens=64, extra_headers={"X-Session-ID": session})
    calls = first.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert pinned(server.base_url, session)["blocks"] >= first.usage.prompt_tokens // BLOCK
    assert turns_counted(server.base_url, "kimi_k2") >= 1
    cycle_pool(server.base_url, seed=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 C."}]
    second = client.chat.completions.create(model="tiny", messages=messages, tools=WEATHER,
                                            max_tokens=64, extra_headers={"X-Session-ID": session})
    assert second.choices[0].message.content == ANSWER and not second.choices[0].message.tool_calls
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens // BLOCK * BLOCK, (first.usage, second.usage)


@pytest.mark.skipif(not CODEX.exists(), reason="Codex CLI not installed (scripts/setup.sh)")
def test_kimi_k2_codex_exec(real_servers, tmp_path):
    server = real_servers["kimi"]
    before = turns_counted(server.base_url, "kimi_k2")
    run_client(server, "continuum", "header:session-id", seed=7, **codex(server, tmp_path))
    assert turns_counted(server.base_url, "kimi_k2") > before
