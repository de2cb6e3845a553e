"""One streamed `/v1/completions` request, read event by event with each
event's arrival time.

The replay client (replay.py) and the calibration's probes
(continuum_lab/calibration/probes.py) both time a request by when its stream's
events arrive: the first token for TTFT, the gaps between tokens for a
decode step. They read the server-sent events the same way, here: `data: `
lines, each a JSON chunk, until `[DONE]`; a refused request (not HTTP 200)
is an error that carries the server's own words.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping

import httpx


async def completion_events(client: httpx.AsyncClient, body: dict,
                            headers: Mapping[str, str] | None = None) -> AsyncIterator[tuple[float, dict]]:
    """POST `body` (which asks for `stream: true`) and yield (time.perf_counter() at
    its arrival, the parsed chunk) for every event before `[DONE]`."""
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")[:500]
            raise RuntimeError(f"HTTP {response.status_code}: {text}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:].strip()
            if payload == "[DONE]":
                return
            arrived = time.perf_counter()
            yield arrived, json.loads(payload)


def token_ids(chunk: dict) -> list[int]:
    """The token ids a chunk carries (the request asked for `return_token_ids`)."""
    return [i for choice in chunk.get("choices") or [] for i in choice.get("token_ids") or []]
