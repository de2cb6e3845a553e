"""N continuum vLLM servers and vLLM's router, as processes on this machine.

`Cluster` starts the instances (each a `vllm serve MODEL --scheduler-cls
continuum` naming itself in a response header, listing its pins on
`/continuum/pins`, and publishing its KV cache events on a Unix socket), a
`KVEventRelay` per instance that serves those events on loopback TCP, and on
demand a `Router` (`vllm-router`) in front of them. `vllm-continuum cluster`
(command.py) and the cluster tests drive it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


from vllm_continuum.config import additional_config_arg
from vllm_continuum.tools.local_server import LocalProcess, VLLMServer, free_port



def kv_events_config(endpoint: str) -> str:
    """vLLM's `--kv-events-config` for a ZMQ publisher at `endpoint`.

    An `ipc://` endpoint binds a Unix socket: nothing listens on the network."""
    return json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": ""}
    )


def router_executable() -> str:
    """The `vllm-router` console script installed beside this Python, or on PATH."""
    beside = Path(sys.executable).with_name("vllm-router")
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError(
            "vllm-router is not installed: pip install 'vllm-continuum[cluster]'"
        )
    return found


class KVEventRelay:
    """Re-publishes one instance's KV events on a loopback TCP port.

    vLLM's ZMQ publisher binds only wildcard (`tcp://*:P`, every interface) or
    `ipc://` endpoints, and vllm-router subscribes only to `tcp://HOST:PORT`.
    So each instance publishes on a Unix socket and this relay (an XSUB/XPUB
    proxy thread) serves it on `tcp://127.0.0.1:PORT`: nothing unauthenticated
    listens beyond loopback."""

    def __init__(self, source: str, port: int | None = None) -> None:
        import threading

        import zmq

        self.source = source
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self._ctx = zmq.Context()
        self._xsub = self._ctx.socket(zmq.XSUB)
        self._xsub.connect(source)
        self._xpub = self._ctx.socket(zmq.XPUB)
        self._xpub.bind(self.endpoint)
        self._thread = threading.Thread(target=self._run, name="kv-event-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        try:
            zmq.proxy(self._xsub, self._xpub)
        except zmq.ContextTerminated:
            pass
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        for sock in (self._xsub, self._xpub):
            sock.close(linger=0)
        self._ctx.term()


class Instance(VLLMServer):
    """One continuum server started through vLLM's own CLI (`vllm serve`)."""

    served_model_name: str | None = None
    kv_events_endpoint: str | None = None

    @property
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm_continuum.adapter.launch", "serve", self.model,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--middleware", "vllm_continuum.cluster.instance_header.InstanceHeaderMiddleware",
               "--middleware", "vllm_continuum.cluster.pins_endpoint.PinsEndpoint"]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.kv_events_endpoint:
            cmd += ["--kv-events-config", kv_events_config(self.kv_events_endpoint)]
        return [*cmd, *self.args]


@dataclass
class Router(LocalProcess):
    """One `vllm-router` process in front of `worker_urls`."""

    worker_urls: Sequence[str]
    policy: str = "consistent_hash"
    kv_event_sources: dict[str, str] = field(default_factory=dict)  # worker URL -> endpoint
    kv_event_block_size: int | None = None
    kv_event_model: str | None = None  # the model name clients send (kv_aware needs it)
    extra_args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    name: str = "vllm-router"
    stop_timeout_s: float = 10.0

    @property
    def command(self) -> list[str]:
        cmd = [router_executable(), "--host", "127.0.0.1", "--port", str(self.port),
               "--policy", self.policy, "--worker-urls", *self.worker_urls,
               # The router's own Prometheus endpoint defaults to a fixed port:
               # give it a free one so that several routers can coexist.
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        if self.policy == "kv_aware":
            for url, endpoint in self.kv_event_sources.items():
                cmd += ["--kv-event-source", f"{url}={endpoint}"]
            if self.kv_event_block_size:
                cmd += ["--kv-event-block-size", str(self.kv_event_block_size)]
            if self.kv_event_model:
                cmd += ["--kv-event-model", self.kv_event_model]
        return [*cmd, *self.extra_args]

    def start(self) -> Router:
        return self._spawn({**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})


@dataclass
class Cluster:
    """N continuum instances (each with a KV-event socket) and, on demand, a router."""

    model: str
    instances: int = 2
    log_dir: Path = Path("runs/cluster")
    vllm_args: Sequence[str] = ()
    served_model_name: str | None = None
    base_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)  # --additional-config's continuum
    kv_events: bool = True
    servers: list[Instance] = field(default_factory=list)
    relays: list[KVEventRelay] = field(default_factory=list)
    router: Router | None = None

    def start_instances(self) -> Cluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.instances):
            port = self.base_port + i if self.base_port else free_port()
            server = Instance(
                self.model,
                ["--scheduler-cls", "continuum", *self.vllm_args,
                 *(additional_config_arg(self.settings) if self.settings else [])],
                env={**self.env, "CONTINUUM_INSTANCE": f"instance-{i}"}, log_path=self.log_dir / f"instance-{i}.log", port=port,
                name=f"instance-{i}",
            )
            server.served_model_name = self.served_model_name
            if self.kv_events:
                server.kv_events_endpoint = f"ipc://{self.log_dir.resolve()}/kv-events-{i}.sock"
            self.servers.append(server.start())
        for server in self.servers:
            server.wait_ready(timeout_s=600)
            if server.kv_events_endpoint:
                self.relays.append(KVEventRelay(server.kv_events_endpoint))
        return self

    @property
    def model_name(self) -> str:
        """The model name clients send (vLLM's served name, else the model path)."""
        return self.served_model_name or vllm_flag(self.vllm_args, "--served-model-name") or self.model

    @property
    def kv_event_sources(self) -> dict[str, str]:
        """Worker URL -> the loopback TCP endpoint of its KV events (the relay)."""
        with_events = [s for s in self.servers if s.kv_events_endpoint]
        return {s.base_url: r.endpoint for s, r in zip(with_events, self.relays)}

    def start_router(self, policy: str, extra_args: Sequence[str] = (), port: int | None = None,
                     block_size: int | None = None) -> Router:
        self.stop_router()
        router = Router(
            [s.base_url for s in self.servers], policy, self.kv_event_sources,
            kv_event_block_size=block_size, kv_event_model=self.model_name,
            extra_args=extra_args,
            log_path=self.log_dir / f"router-{policy}.log",
            **({"port": port} if port else {}),
        )
        self.router = router.start().wait_ready(timeout_s=120)
        return self.router

    def stop_router(self) -> None:
        if self.router is not None:
            self.router.stop()
            self.router = None

    def stop(self) -> None:
        self.stop_router()
        for server in self.servers:
            server.stop()
        for relay in self.relays:
            relay.close()
        self.relays.clear()

    def __enter__(self) -> Cluster:
        try:
            return self.start_instances()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def vllm_flag(vllm_args: Sequence[str], name: str) -> str | None:
    args = list(vllm_args)
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None

