"""A real vLLM scheduler without a model, as vLLM's own CPU scheduler tests build one.

The scheduler, KV cache manager, block pool and prefix cache are vLLM's; the
KV cache config is a fake (one full-attention group of `num_blocks` blocks,
no tensor allocated), so any scheduler class can be driven by synthetic model
outputs. Shared by the simulator and the test harness.
"""

from __future__ import annotations


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
    **scheduler_kwargs,
):
    """`scheduler_kwargs` go to the class (e.g. `continuum_config=`, `continuum_clock=`)."""
    import torch
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
    )
    cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=log_stats,
        **scheduler_kwargs,
    )
