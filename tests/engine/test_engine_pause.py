"""The pause scenario on real vLLM servers (tiny model, CPU): the proof that
pinning keeps a session's KV cache across a tool call where stock vLLM
loses it, measured in the same run."""

from __future__ import annotations

import pytest

from vllm_continuum.demos.pause_scenario import run_pause_scenario

pytestmark = pytest.mark.engine


def test_resumed_turn_reuses_every_full_block_only_with_continuum(live_servers):
    results = {
        flavour: run_pause_scenario(server.base_url, flavour)
        for flavour, server in live_servers.items()
    }
    continuum, stock = results["continuum"], results["stock"]
    for r in results.values():
        assert r.tool_called == "get_weather"
        assert r.turn1_full_block_tokens >= 10 * r.block_size  # a prompt worth keeping
    assert continuum.turn2_cached_tokens >= continuum.turn1_full_block_tokens, continuum
    assert stock.turn2_cached_tokens < stock.turn1_full_block_tokens, stock


def test_continuum_server_log_shows_the_scheduler(live_servers):
    log = live_servers["continuum"].log_path.read_text()
    assert "vllm-continuum scheduler ContinuumScheduler" in log
    assert "Traceback" not in log
