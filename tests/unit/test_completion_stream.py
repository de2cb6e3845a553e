"""The streamed /v1/completions reader that the replay and `calibrate` share
(continuum_lab/live/completion_stream.py), on a server played by httpx."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from continuum_lab.live.completion_stream import completion_events, token_ids


async def _chunks(status: int, body: str) -> list[dict]:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, text=body))
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
        return [chunk async for _, chunk in completion_events(client, {"stream": True})]


def test_events_are_read_until_done():
    body = ('data: {"choices": [{"token_ids": [5, 6]}]}\n\n: a comment\n\n'
            'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n'
            'data: {"after": "done"}\n\n')
    chunks = asyncio.run(_chunks(200, body))
    assert [token_ids(c) for c in chunks] == [[5, 6], []]
    assert chunks[1]["usage"] == {"prompt_tokens": 3}


def test_a_refused_request_carries_the_servers_words():
    with pytest.raises(RuntimeError, match="HTTP 400: max_tokens is too large"):
        asyncio.run(_chunks(400, "max_tokens is too large"))
