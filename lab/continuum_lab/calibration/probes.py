"""The measurements, each isolating engine steps from the API server's own time.

**Prefill** (`prefill_point`): a prompt of n token ids nobody sent before,
`max_tokens` 1, streamed; its time to first token is the API server's
per-request overhead plus the prefill's steps (ceil(n / max_num_batched_tokens)
chunks). With `cached` c > 0, a prefix of c tokens is sent first (and
finishes), so the timed request finds it in the prefix cache and prefills only
its n new tokens, attending to all c + n: a resumed agent turn. The overhead
is not subtracted here: the fit takes it as one unknown shared by all these
points (`api_overhead_s`), which is the small-prompt baseline done by least
squares.

**Decode** (`decode_point`): B streams at context C. Each stream's prefix of
C tokens is sent first, so that the B requests (their prefix plus a few
tokens of their own) find it cached, prefill only their own tokens together,
and then decode side by side, each reading its own C entries, as a replay's
streams do. (One prefix shared by all B, as this probe did before, stays in
the CPU's caches once read, and the replays' decode-only steps ran 1.2-1.4x
what it measured; docs/calibration.md.) B x C must then fit the pool
(grid.py). In the window where all B streams are decoding (after
the last first token, before the first finish), each stream's tokens arrive
one engine step apart: the step time is the window's duration over the tokens
a stream received in it (the median over streams). An inter-token gap holds no
per-request overhead, so nothing is subtracted. The same under a grammar
(`guided`, structured outputs: what a tool call is written with when the
client sends no hints) says what guided decoding adds to a step, which the
simulator does not model: reported beside the fit, not fitted.

Prompts are random ids in the replay's TOKEN_RANGE (ordinary tokens of the
project's tokenizers), distinct per probe, so nothing but the intended prefix
hits.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

from continuum_lab.live.completion_stream import completion_events, token_ids
from continuum_lab.live.replay import TOKEN_RANGE

DECODE_TAIL = 8  # each decode stream's own tokens after the shared prefix
GUIDED = "decode-guided"  # a decode point under a grammar: a diagnostic, not fitted
# A decode point needs the streams side by side for this many steps: fewer gaps
# than that and one scheduling hiccup is the whole measurement.
MIN_WINDOW_STEPS = 4
# How a probe fails: the server refused or broke the stream, the connection
# failed or timed out, or a chunk was not JSON. A caller leaves the point out
# and says so: one failed probe must not end minutes of measurement.
PROBE_ERRORS = (RuntimeError, httpx.HTTPError, json.JSONDecodeError)


@dataclass
class Point:
    """One measurement: the engine steps it timed, each a batch of (new tokens,
    cached tokens) per request, and the seconds measured. `overhead`: whether
    the time holds one request's API overhead (prefill TTFT) or not (a gap)."""

    kind: str  # "prefill", "decode" or GUIDED
    params: dict
    steps: list[list[tuple[int, int]]]
    measured_s: float
    overhead: bool
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """Each batch as [new, cached, requests] rows (a decode step of 64 alike is one row)."""
        data = asdict(self)
        data["steps"] = [[[n, c, k] for (n, c), k in Counter(batch).items()] for batch in self.steps]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Point:
        steps = [[(n, c) for n, c, k in batch for _ in range(k)] for batch in data["steps"]]
        return cls(data["kind"], data["params"], steps, data["measured_s"], data["overhead"],
                   data.get("detail", {}))


class Prompts:
    """Fresh random prompts, reproducible under the seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def fresh(self, n: int) -> list[int]:
        return [self._rng.randrange(*TOKEN_RANGE) for _ in range(n)]


async def stream_completion(client: httpx.AsyncClient,
                            body: dict) -> tuple[float, list[tuple[float, int]], dict]:
    """Send a streamed completion; return (send time, [(arrival, tokens)] per chunk
    that carried tokens, usage)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True, "temperature": 0.0}
    chunks: list[tuple[float, int]] = []
    usage: dict = {}
    sent = time.perf_counter()
    async for arrived, chunk in completion_events(client, body):
        if chunk.get("error"):  # vLLM reports a failure inside a started stream this way
            raise RuntimeError(f"the server's stream ended in an error: {chunk['error']}")
        ids = len(token_ids(chunk))
        if ids:
            chunks.append((arrived, ids))
        usage = chunk.get("usage") or usage
    return sent, chunks, usage


def _cached(usage: dict) -> int | None:
    details = usage.get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return None if value is None else int(value)


async def _warm(client: httpx.AsyncClient, model: str, prompt: list[int]) -> None:
    """Leave `prompt` in the prefix cache (its full blocks)."""
    await stream_completion(client, {"model": model, "prompt": prompt, "max_tokens": 1})


async def prefill_point(client: httpx.AsyncClient, model: str, prompts: Prompts, n: int,
                        cached: int, block_size: int, chunk: int) -> Point:
    prefix = prompts.fresh(cached)
    if cached:
        await _warm(client, model, prefix)
    sent, chunks, usage = await stream_completion(
        client, {"model": model, "prompt": prefix + prompts.fresh(n), "max_tokens": 1})
    if not chunks:
        raise RuntimeError(f"a prefill of {n} tokens returned no token")
    # What the engine found cached: the server's count if it reports it
    # (--enable-prompt-tokens-details), else the prefix's full blocks.
    reported = _cached(usage)
    hit = cached // block_size * block_size if reported is None else reported
    new = cached + n - hit
    steps = [[(k, hit + done)] for done, k in _chunks(new, chunk)]
    return Point("prefill", {"n": n, "cached": cached}, steps, chunks[0][0] - sent, True,
                 {"cache_hit_tokens": hit, "cached_reported": reported is not None})


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    """(tokens done before, tokens in this chunk) of a prefill chunked by `size`."""
    return [(done, min(size, n - done)) for done in range(0, n, size)]


def _widest_full_window(streams: list[list[tuple[float, int]]]) -> tuple[float, float, int]:
    """The longest interval in which the most streams decode at once: (start, end, how many).
    A stream decodes from its first token to its last. Usually all B overlap; under load
    the API server may hand the engine the last requests after the first finished."""
    spans = [(chunks[0][0], chunks[-1][0]) for chunks in streams]
    edges = sorted({t for span in spans for t in span})
    # Between consecutive edges the set of decoding streams does not change.
    active = [(a, b, sum(s <= a and b <= e for s, e in spans)) for a, b in zip(edges, edges[1:])]
    if not active:
        raise RuntimeError("every decode stream's tokens arrived at one instant: no step to time")
    most = max(k for _, _, k in active)
    best, run = (0.0, 0.0), None  # run: the current stretch of intervals with `most` streams
    for a, b, k in active:
        run = (run[0] if run else a, b) if k == most else None
        if run and run[1] - run[0] > best[1] - best[0]:
            best = run
    return best[0], best[1], most


def steady_step_s(streams: list[list[tuple[float, int]]]) -> tuple[float, dict]:
    """The step time from B streams' token arrivals: in the longest window where the
    most streams decode at once (all B, unless the server staggered them), each
    stream's elapsed time over the tokens it received (median over streams)."""
    start, end, batch = _widest_full_window(streams)
    per_stream, tokens_in_window = [], []
    for chunks in streams:
        inside = [(t, k) for t, k in chunks if start <= t <= end]
        if len(inside) < 2:
            continue
        tokens = sum(k for _, k in inside[1:])
        per_stream.append((inside[-1][0] - inside[0][0]) / tokens)
        tokens_in_window.append(tokens)
    if len(per_stream) < batch or statistics.median(tokens_in_window) < MIN_WINDOW_STEPS:
        raise RuntimeError(f"{len(streams)} decode streams never decoded side by side for "
                           f"{MIN_WINDOW_STEPS} steps: raise --decode-tokens or lower --batches")
    # Fewer than half side by side: the streams did not run as one batch (one
    # stream's tokens were read in a burst after the others', 47 in under 1 ms):
    # what the window times is not a step of this point.
    if batch < (len(streams) + 1) // 2:
        raise RuntimeError(f"only {batch} of {len(streams)} decode streams ran side by side")
    step = statistics.median(per_stream)
    return step, {"window_s": end - start, "tokens_per_stream": statistics.median(tokens_in_window),
                  "batch_decoding": batch, "stream_step_s_min": min(per_stream),
                  "stream_step_s_max": max(per_stream)}


async def decode_point(client: httpx.AsyncClient, model: str, prompts: Prompts, batch: int,
                       context: int, tokens: int, block_size: int, guided: bool = False,
                       shared_prefix: bool = False) -> Point:
    """`guided`: the streams decode under a grammar (structured outputs, as a tool call
    is written without client hints): `tokens` digits, which the simulator does not
    model; the point is a diagnostic, kind GUIDED, left out of the fit.
    `shared_prefix`: the streams share one cached prefix instead of each having its
    own (the probe before; scripts/decode_prefix_probe.py compares the two)."""
    n = context // block_size * block_size
    prefixes = [prompts.fresh(n)] * batch if shared_prefix else [prompts.fresh(n) for _ in range(batch)]
    for prefix in prefixes[:1] if shared_prefix else prefixes:
        if prefix:
            await _warm(client, model, prefix)
    body = {"model": model, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    if guided:  # exactly `tokens` digits, then the grammar ends the stream
        body = {"model": model, "max_tokens": tokens,
                "structured_outputs": {"regex": f"[0-9]{{{tokens}}}"}}
    results = await asyncio.gather(*(
        stream_completion(client, {**body, "prompt": prefix + prompts.fresh(DECODE_TAIL)})
        for prefix in prefixes))
    streams = [chunks for _, chunks, _ in results]
    if any(len(chunks) < 2 for chunks in streams):
        raise RuntimeError(f"a decode stream of {tokens} tokens sent under 2 chunks")
    step, detail = steady_step_s(streams)
    # What each stream found cached, where the server reports it: its prefix's n tokens.
    detail |= {"shared_prefix": shared_prefix, "cache_hit_tokens": [_cached(u) for _, _, u in results]}
    # The window's mean position: contexts grow by one token a step.
    mid = n + DECODE_TAIL + round(tokens - detail["tokens_per_stream"] / 2)
    decoding = detail["batch_decoding"]  # the step held this many decodes (B, unless staggered)
    return Point(GUIDED if guided else "decode", {"batch": batch, "context": context},
                 [[(1, mid)] * decoding], step, False, {**detail, "context_mid": mid})
