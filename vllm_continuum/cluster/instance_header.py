"""`X-Continuum-Instance`: which server answered, on every response.

Behind a router a client cannot tell which engine served a request; for
debugging session affinity (and for the cluster tests) each instance can
name itself in a response header. vLLM's `--middleware` flag loads it:

    CONTINUUM_INSTANCE=gpu-node-3 vllm serve MODEL --scheduler-cls continuum \\
        --middleware vllm_continuum.cluster.instance_header.InstanceHeaderMiddleware

`vllm-continuum cluster` sets it on every instance (`instance-0`, ...).
"""

from __future__ import annotations

import os

HEADER = "X-Continuum-Instance"
_ASGI_NAME = HEADER.lower().encode()  # ASGI header names are lower-case bytes
ENV = "CONTINUUM_INSTANCE"


class InstanceHeaderMiddleware:
    """Pure ASGI middleware: adds the header to every HTTP response start."""

    def __init__(self, app) -> None:
        self.app = app
        self.value = os.environ.get(ENV, "").encode("latin-1", "replace") or None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.value is None:
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (_ASGI_NAME, self.value)]}
            await send(message)

        return await self.app(scope, receive, send_with_header)
