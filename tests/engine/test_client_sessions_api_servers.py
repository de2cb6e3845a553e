"""The client-session middleware with `--api-server-count 2` (vLLM's own CLI:
the continuum server of `client_servers`).

vLLM builds the app, and so every `--middleware`, in each API-server
process; requests land on either. Six LiteLLM-style sessions (the session
only in `prompt_cache_key`) pause on a tool call and come back: every turn
must have been read by whichever process took it, or its pin is missed.
"""

from __future__ import annotations

import re

import pytest

from tests.engine.client_turns import LiteLLM
from tests.engine.test_client_sessions_live import BLOCK, pause, pinned, sessions_counted

pytestmark = pytest.mark.engine
SESSIONS = 6


def test_every_api_server_reads_client_sessions(client_servers):
    server = client_servers["continuum"]
    url = server.base_url
    before = sessions_counted(url, "body:prompt_cache_key")
    for i in range(SESSIONS):
        dialect, seed = LiteLLM(seed=200 + i), 200 + i
        seen = {}
        first, second = pause(dialect, url, seed,
                              lambda _: seen.update(pin=pinned(url, dialect.session)))
        assert seen["pin"] is not None, f"session {i}: its tool-call turn was not pinned"
        assert second.cached_tokens >= first.prompt_tokens // BLOCK * BLOCK, (i, first, second)
    # Counted in both processes' multiprocess files, summed on every scrape.
    assert sessions_counted(url, "body:prompt_cache_key") >= before + 2 * SESSIONS
    # Each process logs the first session it reads from a spelling: both did.
    readers = set(re.findall(r"\((\w+) pid=(\d+)\)[^\n]*reading sessions from "
                             r"body:prompt_cache_key", server.log_path.read_text()))
    assert len(readers) == 2, readers
