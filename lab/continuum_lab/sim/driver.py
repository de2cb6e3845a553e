"""A real vLLM scheduler without a model, stepped with synthetic model outputs.

As vLLM's own CPU scheduler tests do it: the scheduler, KV cache manager,
block pool and prefix cache are vLLM's; the KV cache config is a fake (one
full-attention group of `num_blocks` blocks, no tensor allocated), so any
scheduler class can be built, and the model runner is replaced by
`synthetic_output`: each scheduled request whose prefill is complete samples
one token, the one its caller scripted. The simulator's event loop (loop.py)
and the scheduler tests (tests/scheduler/harness.py) drive schedulers through this
module alone.

vLLM is imported inside the functions, so that the experiment commands load
without it until they build a scheduler.
"""

from __future__ import annotations

import random
from collections.abc import Callable

EOS_TOKEN_ID = 0
TOKEN_RANGE = (100, 2300)  # ordinary tokens of the tiny tokenizer (no EOS, no <tool_call>)


class SimClock:
    """A clock the scheduler reads and its driver moves (`scheduler.clock`)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def random_tokens(seed: int | str, n: int) -> list[int]:
    """n ordinary token ids, the same for the same seed; distinct seeds give
    distinct first blocks (and block hashes)."""
    rng = random.Random(seed)
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def new_scheduler(
    cls: type,
    model_dir: str,
    *,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    async_scheduling: bool = False,
    policy: str = "fcfs",
    log_stats: bool = False,
    enable_prefix_caching: bool = True,
    sliding_window: int | None = None,
    kv_transfer_config=None,
    additional_config: dict | None = None,
    kv_bytes_per_token: int | None = None,
    **scheduler_kwargs,
):
    """A scheduler of class `cls` (vLLM's or ours) over a KV pool of `num_blocks`;
    `scheduler_kwargs` go to the class (e.g. `continuum_config=`, `continuum_clock=`).
    `sliding_window`: a hybrid model, a full-attention KV cache group and a
    sliding-window one of that many tokens sharing the pool. `kv_transfer_config`:
    vLLM's `KVTransferConfig` of a KV connector (the scheduler side only runs).
    `additional_config`: `--additional-config`'s object, as the server would pass it.
    `kv_bytes_per_token`: the modelled model's KV size (what a KV connector
    reads of the fake cache; default: a small one)."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_dir, max_model_len=max_model_len, seed=0)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        policy=policy,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=kv_transfer_config,
        additional_config=additional_config or {},
    )
    cache_config.num_gpu_blocks = num_blocks
    # vLLM's CPU platform turns async scheduling off whatever was asked; the
    # scheduler under test is the GPU's, which runs with it on (so that, e.g.,
    # a KV-consumer connector defers block frees as it does there).
    scheduler_config.async_scheduling = async_scheduling
    shape = _kv_shape(block_size, kv_bytes_per_token)
    groups = [KVCacheGroupSpec(["layer"], FullAttentionSpec(**shape))]
    if sliding_window is not None:
        swa = SlidingWindowSpec(sliding_window=sliding_window, **shape)
        groups.append(KVCacheGroupSpec(["swa_layer"], swa))
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=log_stats,
        **scheduler_kwargs,
    )


def _kv_shape(block_size: int, kv_bytes_per_token: int | None = None) -> dict:
    """The fake KV cache's one layer (no tensor is allocated): 512 bytes a
    token, or `kv_bytes_per_token` (K and V in BF16, heads of 64)."""
    import torch

    if kv_bytes_per_token is None:
        return dict(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    heads, rest = divmod(int(kv_bytes_per_token), 2 * 2 * 64)
    if rest or heads < 1:
        raise ValueError(f"kv_bytes_per_token {kv_bytes_per_token}: not a multiple of 256")
    return dict(block_size=block_size, num_kv_heads=heads, head_size=64, dtype=torch.bfloat16)


def page_size_bytes(block_size: int, kv_bytes_per_token: int | None = None) -> int:
    """Bytes of one block of the fake KV cache (what a KV connector built on it
    reads: its host buffer's size, what a copy moves)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(**_kv_shape(block_size, kv_bytes_per_token)).page_size_bytes


def block_hasher(block_size: int):
    """The prefix cache's hasher of a request's full blocks (sha256, as the engine's)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


def synthetic_request(
    request_id: str,
    prompt: list[int],
    *,
    hasher,
    max_tokens: int,
    session: str | None = None,
    xargs: dict | None = None,
    arrival: float | None = None,
    priority: int = 0,
    ignore_eos: bool = False,
    cache_salt: str | None = None,
):
    """A request as the engine core receives it: a token-id prompt, its session
    and continuum hints (`xargs`, read from `sampling_params.extra_args`), its
    `cache_salt` (a tenant: it changes every block hash)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, extra_args=xargs)
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival,
        block_hasher=hasher,
        session_id=session,
        priority=priority,
        cache_salt=cache_salt,
    )


def synthetic_output(scheduler, scheduled, next_token: Callable[[object], int]):
    """The model runner's output for a step `schedule()` returned: each request
    whose prefill is complete samples `next_token(request)`, a request in the
    middle of its prefill samples nothing. Also returns the batch as a cost
    model reads it: (new tokens, tokens already in the KV cache) per request."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids, sampled, batch = [], [], []
    for req_id, n in scheduled.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        req_ids.append(req_id)
        batch.append((n, request.num_computed_tokens - n))
        sampled.append([next_token(request)] if request.num_computed_tokens >= request.num_tokens else [])
    output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
    return output, batch
