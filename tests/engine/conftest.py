"""The engine tier: real vLLM servers. Every test here is marked `engine`
(so `-m 'not engine'` runs the fast tiers alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == _HERE:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def client_servers(tiny_model_dir, tmp_path_factory):
    """Stock vLLM, and continuum reading agent clients' sessions
    (`ClientSessionMiddleware`) and listing its pins, with two API-server
    processes: same model, flags and KV pool as `live_servers`, apart so that
    the clients' refused requests (vLLM logs tracebacks for some) stay out of
    those servers' logs."""
    from vllm_continuum.demos.pause_demo import DEMO_SETTINGS
    from vllm_continuum.tools.local_server import flavour_server

    log_dir = tmp_path_factory.mktemp("client-server-logs")
    frontend = ["--middleware", "vllm_continuum.frontend.middleware.ClientSessionMiddleware",
                "--middleware", "vllm_continuum.cluster.pins_endpoint.PinsEndpoint"]
    servers = {f: flavour_server(f, tiny_model_dir, log_dir,
                                 settings={**DEMO_SETTINGS, "log_level": "DEBUG"},
                                 extra_args=frontend if f == "continuum" else ())
               for f in ("stock", "continuum")}
    # The continuum one through vLLM's CLI with two API-server processes: each
    # builds the app and its middleware, and either may take a request.
    from tests.engine.test_engine_metrics import CliServer

    plain = servers["continuum"]
    servers["continuum"] = CliServer(plain.model, [*plain.args, "--api-server-count", "2"],
                                     env=plain.env, log_path=plain.log_path, name="continuum")
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready(timeout_s=420)
        yield servers
    finally:
        for server in servers.values():
            server.stop()
