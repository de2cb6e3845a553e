"""The tiny model's weights: a small Qwen2 (Qwen2.5's architecture), seeded random.

Random weights cost the same compute per token as trained ones, and the
scheduler only sees token ids and KV blocks. One fixed logit bias is baked
in (`_add_logit_bias`) so that guided tool calls come out compact, as a
trained Hermes/Qwen model's would.
"""

from __future__ import annotations

import pathlib
from typing import Any

from vllm_continuum.tools.tiny_model.tokenizer import EOS_TOKEN

MODEL_SPEC: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 64: a size the CPU attention kernels take
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    # Logit penalty on tokens that contain "<", newlines or tabs, or are only
    # whitespace, so guided tool calls are compact and use the single
    # <tool_call> token (see _add_logit_bias). 0 disables it.
    "logit_penalty": 10.0,
    # vLLM's dtype "auto" runs any checkpoint as bfloat16 on CPU; serve with
    # --dtype float32, faster on AVX2-only CPUs (no bf16 matmul there).
    "dtype": "float32",
}


def _penalized_token_ids(tokenizer: Any) -> list[int]:
    """BPE tokens that contain "<", are whitespace only, or hold any
    whitespace but a plain space (newlines, tabs)."""
    added = set(tokenizer.get_added_vocab().values())
    ids = []
    for i in range(len(tokenizer)):
        if i in added:
            continue
        text = tokenizer.decode([i])
        if "<" in text or not text.strip() or any(ch.isspace() and ch != " " for ch in text):
            ids.append(i)
    return ids


def _add_logit_bias(model: Any, tokenizer: Any, penalized: list[int]) -> None:
    """Give the random model a fixed logit bias against ``penalized`` tokens.

    Qwen2's LM head has no bias, so hidden channel 0 is made constant: every
    embedding gets 1.0 there, which dominates the (0.02-scale) random
    channels, so after the final RMSNorm it is a near-constant ``c``; the LM
    head's column 0 is then ``bias / c``. Why: under guided decoding a random
    model otherwise (1) spells ``<tool_call>`` byte by byte about half the time
    (``<`` + ``tool`` + ...) instead of emitting the single token, as trained
    Hermes/Qwen models do, and (2) pads the JSON arguments with whitespace
    runs (xgrammar's structural tags ignore ``disable_any_whitespace``), so a
    call took up to 70 tokens and ``max_tokens=64`` cut 1 in 10 (with the
    bias: at most 44 tokens, none cut). Unconstrained text merely
    loses ``<``, line breaks and tabs. Chance emissions of ``<tool_call>``
    keep their uniform odds (about one in the vocabulary size per token).
    """
    import torch

    penalty = float(MODEL_SPEC["logit_penalty"])
    if not penalty or not penalized:
        return
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        lm = model.lm_head.weight
        lm[:, 0] = 0.0
        probe = tokenizer('The weather in Paris is {"unit": 1}', return_tensors="pt")
        hidden = model.model(**probe).last_hidden_state  # after the final norm
        c = float(hidden[0, :, 0].mean())
        lm[penalized, 0] = -penalty / c


def build_weights(out: pathlib.Path, tokenizer: Any, seed: int) -> None:
    """The Qwen2 model with seeded random weights and the logit bias, saved
    to ``out`` as safetensors with its config and generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec = dict(MODEL_SPEC)
    dtype = getattr(torch, spec.pop("dtype"))
    spec.pop("logit_penalty")
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    im_end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_sliding_window=False,
        **spec,
    )
    rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).eval()
        _add_logit_bias(model, tokenizer, _penalized_token_ids(tokenizer))
    finally:
        torch.random.set_rng_state(rng_state)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=[im_end_id, eos_id],  # a chat turn ends at <|im_end|>
        pad_token_id=eos_id,
    )
    model.save_pretrained(out, safe_serialization=True)
