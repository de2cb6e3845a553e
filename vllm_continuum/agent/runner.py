"""Run the agent service's ASGI app on a real port, in a background thread.

For the demo and tests: the service is driven over real HTTP while the
caller's thread stays free. uvicorn runs its own event loop in the thread;
everything async the app owns (the OpenAI client included) lives there.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from vllm_continuum.tools.local_server import free_port

__all__ = ["ServiceThread"]


class ServiceThread:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host, self.port = host, port or free_port()
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="agent-service", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServiceThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"agent service did not start on {self.base_url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> ServiceThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
