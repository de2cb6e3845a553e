"""A scripted KV connector for the scheduler tests, built the way vLLM's own
scheduler tests build theirs (`tests/v1/kv_connector/unit/utils.py`,
`MockKVConnector`): the scheduler-side methods of `KVConnectorBase_V1`,
whose answers each test sets per request. With a consumer role and async
scheduling, vLLM defers block frees (`Scheduler.defer_block_free`).

- `external[request_id] = (tokens, is_async)`: what the remote tier holds
  beyond the local prefix hit; async loads wait in vLLM's own holding queue
  until the driver reports them in `finished_recving`.
- `delay_free`: requests whose blocks the connector keeps after they finish
  (it sends them, as a prefill-side NIXL does) until `finished_sending`.
- `on_query`: called at each lookup (e.g. to make it slow).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

from tests.scheduler.harness import FILLER_TOKEN, audit
from continuum_lab.sim.driver import synthetic_output

MODULE = __name__
NAME = "ScriptedKVConnector"


class ScriptedKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.external: dict[str, tuple[int, bool]] = {}
        self.delay_free: set[str] = set()
        self.on_query: Callable[[object], None] = lambda request: None
        self.loads: list[str] = []  # requests whose async load started

    # --- scheduler side ----------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.on_query(request)
        tokens, is_async = self.external.get(request.request_id, (0, False))
        tokens = max(0, min(tokens, request.num_tokens - 1 - num_computed_tokens))
        if tokens and is_async:
            self.loads.append(request.request_id)
        return tokens, bool(tokens) and is_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return request.request_id in self.delay_free, None

    # --- worker side: never called without a model -----------------------
    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    def wait_for_save(self):
        raise NotImplementedError


def kv_transfer_config(role: str = "kv_both"):
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector=NAME, kv_connector_module_path=MODULE, kv_role=role)


@dataclass
class ConnectorDriver:
    """Steps a scheduler with a synthetic model and a KV connector's scripted
    worker side; under async scheduling, one step stays in flight (a batch
    queue of two), as vLLM's engine core runs it: step N+1 is scheduled
    before step N's output is processed. The block audit runs at every step.

    `recv_done` / `send_done`: requests reported at the next output
    (`ScriptedKVConnector`); `worker`: a scripted worker given each step's
    connector metadata (`scheduled(meta)`) and asked for its output fields
    (`output()`), e.g. the offload connector's (offload_worker.py)."""

    scheduler: object
    worker: object | None = None
    scripts: dict[str, list[int]] = field(default_factory=dict)
    recv_done: set[str] = field(default_factory=set)  # reported at the next output
    send_done: set[str] = field(default_factory=set)
    pending: tuple | None = None

    def add(self, request, script=None):
        if script is not None:
            self.scripts[request.request_id] = list(script)
        self.scheduler.add_request(request)
        return request

    def _next_token(self, request) -> int:
        script = self.scripts.get(request.request_id)
        return script.pop(0) if script else FILLER_TOKEN

    def _process(self, out, runner) -> None:
        from vllm.v1.outputs import KVConnectorOutput

        fields = self.worker.output() if self.worker is not None else {}
        recving = set(self.recv_done) | fields.pop("finished_recving", set())
        runner.kv_connector_output = KVConnectorOutput(
            finished_recving=recving, finished_sending=set(self.send_done), **fields)
        self.recv_done.clear()
        self.send_done.clear()
        self.scheduler.update_from_output(out, runner)

    def step(self):
        s = self.scheduler
        out = s.schedule()
        if self.worker is not None:
            self.worker.scheduled(out.kv_connector_metadata)
        runner, _ = synthetic_output(s, out, self._next_token)
        if not s.scheduler_config.async_scheduling:
            self._process(out, runner)
        else:
            if self.pending is not None:
                self._process(*self.pending)
            self.pending = (out, runner)
        audit(s)
        return out

    def flush(self):
        if self.pending is not None:
            self._process(*self.pending)
            self.pending = None
            audit(self.scheduler)

    def until(self, done, max_steps: int = 100) -> None:
        for _ in range(max_steps):
            if done():
                return
            self.step()
        raise AssertionError("condition not reached")
