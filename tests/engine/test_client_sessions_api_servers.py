"""The client-session middleware with `--api-server-count 2` (vLLM's own CLI).

vLLM builds the app, and so every `--middleware`, in each API-server
process; requests land on either. Six LiteLLM-style sessions (the session
only in `prompt_cache_key`) pause on a tool call and come back: every turn
must have been read by whichever process took it, or its pin is missed.
"""

from __future__ import annotations

import pytest

from tests.engine.client_turns import LiteLLM
from tests.engine.test_client_sessions_live import BLOCK, pause, pinned, sessions_counted
from tests.engine.test_engine_metrics import CliServer
from vllm_continuum.config import additional_config_arg
from vllm_continuum.tools.local_server import CPU_SERVER_FLAGS

pytestmark = pytest.mark.engine
SESSIONS = 6


@pytest.fixture(scope="module")
def two_api_servers(tiny_model_dir, tmp_path_factory):
    num_blocks = 64
    args = [
        *CPU_SERVER_FLAGS,
        "--num-gpu-blocks-override", str(num_blocks),
        "--max-model-len", str((num_blocks - 1) * BLOCK),
        "--scheduler-cls", "continuum",
        "--api-server-count", "2",
        "--middleware", "vllm_continuum.frontend.middleware.ClientSessionMiddleware",
        "--middleware", "vllm_continuum.cluster.pins_endpoint.PinsEndpoint",
        *additional_config_arg({"max_ttl_s": 60}),
    ]
    log = tmp_path_factory.mktemp("server-logs-client-sessions") / "two_api.log"
    with CliServer(tiny_model_dir, args, log_path=log, name="two_api") as server:
        yield server


def test_every_api_server_reads_client_sessions(two_api_servers):
    url = two_api_servers.base_url
    for i in range(SESSIONS):
        dialect, seed = LiteLLM(seed=200 + i), 200 + i
        seen = {}
        first, second = pause(dialect, url, seed,
                              lambda _: seen.update(pin=pinned(url, dialect.session)))
        assert seen["pin"] is not None, f"session {i}: its tool-call turn was not pinned"
        assert second.cached_tokens >= first.prompt_tokens // BLOCK * BLOCK, (i, first, second)
    # Counted in both processes' multiprocess files, summed on every scrape.
    assert sessions_counted(url, "body:prompt_cache_key") >= 2 * SESSIONS
