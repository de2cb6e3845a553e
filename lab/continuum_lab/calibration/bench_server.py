"""`calibrate --bench-server`: start the CPU benchmark's server, as `compare` starts
its stock flavour (the benchmark model of `--layers` depth, the same flags,
pool, context window and model threads), calibrate it, and stop it: so that the
cost model describes exactly the server the live runs use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def bench_server(num_layers: int, num_blocks: int, max_model_len: int, log_dir: Path,
                 env: dict[str, str] | None = None) -> Iterator[str]:
    """The base URL of the running server, stopped on leaving. `env`: the server's
    (default: flavours.bench_server_env(), its model worker on every core but one)."""
    from continuum_lab.live.bench_model import bench_model
    from continuum_lab.live.flavours import START_TIMEOUT_S, bench_server_env
    from vllm_continuum.tools.local_server import flavour_server

    env = env or bench_server_env()
    server = flavour_server("stock", str(bench_model(num_layers)), log_dir, num_blocks=num_blocks,
                            extra_args=["--max-model-len", str(max_model_len)], env=env)
    server.ready_timeout_s = START_TIMEOUT_S
    print(f"[calibrate] starting the benchmark server ({num_layers} layers, {num_blocks} blocks, "
          f"{env}); log: {server.log_path}", flush=True)
    with server:
        yield server.base_url
