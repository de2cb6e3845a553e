"""A random-weight model with a real architecture's shape, for the CPU benchmark.

The tiny model (tools/tiny_model) prefills thousands of tokens in milliseconds:
losing a session's KV cache costs nothing there, so pinning cannot show a
gain. The benchmark model keeps the per-layer shape of Qwen2.5-0.5B (hidden
896, 14 query heads and 2 KV heads of 64, MLP 4864; the real model's
config.json) so that prefill costs what that architecture costs, with a
configurable depth (the real model has 24 layers; the benchmark's default,
flavours.DEFAULT_LAYERS, keeps a run within minutes on two CPU cores). The vocabulary is the tiny model's
tokenizer (3k tokens): the benchmark sends token ids, and a 152k-entry LM
head would only slow the decode down. Random weights compute exactly like
trained ones; the scheduler only sees token ids and KV blocks.
"""

from __future__ import annotations

import json
import pathlib

from vllm_continuum.tools.atomic_dir import replacing_dir

# Qwen2.5-0.5B's shape (its config.json), but the depth and the vocabulary.
QWEN25_05B_SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
BUILD_VERSION = "1"
MARKER = ".vllm_continuum_bench_model.json"


def kv_bytes_per_block(num_layers: int, block_size: int, dtype_bytes: int = 4) -> int:
    """The benchmark model's KV cache bytes a block (keys and values of every
    layer; float32 as the CPU servers run it): what sizes a host tier."""
    head_dim = QWEN25_05B_SHAPE["hidden_size"] // QWEN25_05B_SHAPE["num_attention_heads"]
    per_token = 2 * QWEN25_05B_SHAPE["num_key_value_heads"] * head_dim * dtype_bytes * num_layers
    return per_token * block_size


def bench_model_spec(num_layers: int) -> dict:
    return {**QWEN25_05B_SHAPE, "num_hidden_layers": num_layers, "build": BUILD_VERSION}


def bench_model(num_layers: int, model_dir: str | pathlib.Path | None = None) -> pathlib.Path:
    """The benchmark model of this depth, built if missing (by default in the user's
    cache, one directory per depth): what `compare` and `calibrate --bench-server` serve."""
    if model_dir is None:
        model_dir = pathlib.Path.home() / ".cache" / "vllm-continuum" / f"bench-model-{num_layers}l"
    return build_bench_model(model_dir, num_layers)


def build_bench_model(path: str | pathlib.Path, num_layers: int) -> pathlib.Path:
    """Write the benchmark model to `path` (idempotent for the same spec)."""
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from vllm_continuum.tools.tiny_model import build_tiny_model

    target = pathlib.Path(path).expanduser().resolve()
    spec = bench_model_spec(num_layers)
    marker = target / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return target
    tiny = build_tiny_model(target.parent / f".{target.name}-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        num_hidden_layers=num_layers,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_sliding_window=False,
        **QWEN25_05B_SHAPE,
    )
    with replacing_dir(target) as tmp:
        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            model = Qwen2ForCausalLM(config).eval().to(torch.float32)
        finally:
            torch.random.set_rng_state(state)
        model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(spec))
    return target

