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

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

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
