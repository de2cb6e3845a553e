from __future__ import annotations

import contextlib
import os

import pytest

# vLLM must know the device before any config is built (official vLLM is a
# CUDA build and cannot infer it on a CPU machine).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from vllm_continuum.tools.tiny_model import build_tiny_model

    cached = os.environ.get("CONTINUUM_TINY_MODEL_DIR")
    target = cached or str(tmp_path_factory.mktemp("tiny-model"))
    return str(build_tiny_model(target))


@pytest.fixture(scope="session")
def kimi_model_dir(tmp_path_factory) -> str:
    """The tiny model built as Kimi K2: its tool-call tokens and chat template."""
    from vllm_continuum.tools.tiny_model import build_tiny_model

    cached = os.environ.get("CONTINUUM_TINY_MODEL_DIR")
    target = f"{cached}-kimi_k2" if cached else str(tmp_path_factory.mktemp("tiny-kimi"))
    return str(build_tiny_model(target, family="kimi_k2"))


@pytest.fixture(scope="session")
def live_servers(tiny_model_dir, tmp_path_factory):
    """A stock vLLM server and a continuum one, same model, flags and KV pool."""
    from vllm_continuum.demos.pause_demo import DEMO_SETTINGS
    from vllm_continuum.tools.local_server import flavour_server

    log_dir = tmp_path_factory.mktemp("server-logs")
    # DEBUG: the scheduler logs every TTL decision with its session and tool,
    # which several tests read.
    settings = {**DEMO_SETTINGS, "log_level": "DEBUG"}
    servers = {f: flavour_server(f, tiny_model_dir, log_dir, settings=settings)
               for f in ("stock", "continuum")}
    with serving(servers):
        yield servers


@contextlib.contextmanager
def serving(servers: dict):
    """Start the servers side by side, wait until all are ready, stop them after."""
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
