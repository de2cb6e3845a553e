"""`GET /continuum/pins`: which sessions hold a pin on this server, and until when.

A pin's expiry cannot travel in vLLM's KV events (docs/scaling.md); this is
the side channel for routers and operators that want it. vLLM's
`--middleware` flag loads it (opt-in):

    vllm serve MODEL --scheduler-cls continuum \\
        --middleware vllm_continuum.cluster.pins_endpoint.PinsEndpoint

    GET /continuum/pins  ->
    {"engines": 1, "pins": [{"session_sha256": "3f2a...", "blocks": 14,
                              "expires_in_s": 21.4, "ttl_s": 30.0, "held": false}]}

Sessions are named by the first 32 hex digits of the SHA-256 of their id
(`session_digest`): a router that knows a session id can look it up, and
the ids themselves never leave the engine. `expires_in_s` is judged now,
like the metrics: a pin whose TTL passed while the engine slept is gone
(after `EXPIRY_GRACE_S`); `held` pins (their next turn is queued) stay until
the hand-off. With data parallelism every engine core's pins are listed.
Read-only, no request body, served by the API server from the engine
cores' snapshot files (`CONTINUUM_METRICS_DIR`).
"""

from __future__ import annotations

import hashlib
import json
import os

from vllm_continuum.metrics.snapshot import (
    ENV_DIR,
    EXPIRY_GRACE_S,
    monotonic,
    read_snapshots,
)

PATH = "/continuum/pins"


def session_sha256(session_id: str) -> str:
    """What a router computes to find a session in the listing."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def live_pins(directory: str | None, now: float | None = None) -> dict:
    """The pins held now, from every live engine core's snapshot."""
    now = monotonic() if now is None else now
    engines, pins = 0, []
    for snap in read_snapshots(directory) if directory else ():
        engines += 1
        age = now - float(snap.get("mono", now))
        idle = bool(snap.get("idle"))
        for row in snap.get("pins", ()):
            if len(row) < 5:
                continue  # a snapshot from before session digests: nothing to name
            blocks, left_s, ttl_s, held, digest = row[:5]
            remaining = float(left_s) - age
            if idle and not held and remaining <= -EXPIRY_GRACE_S:
                continue  # expired while the engine slept (as the metrics judge it)
            pins.append({
                "session_sha256": digest,
                "blocks": round(float(blocks), 2),  # its share of blocks shared by pins
                "expires_in_s": round(max(0.0, remaining), 3),
                "ttl_s": round(float(ttl_s), 3),
                "held": bool(held),
            })
    pins.sort(key=lambda p: p["expires_in_s"])
    return {"engines": engines, "pins": pins}


class PinsEndpoint:
    """Pure ASGI middleware answering `GET /continuum/pins`; passes the rest on."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") != PATH:
            return await self.app(scope, receive, send)
        if scope.get("method") not in ("GET", "HEAD"):
            return await _respond(send, 405, {"error": "GET only"})
        return await _respond(send, 200, live_pins(os.environ.get(ENV_DIR)))


async def _respond(send, status: int, body: dict) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": payload})
