"""Build a tiny random-weight chat model that vLLM can serve, without network.

Tests, demos and benchmarks need a real vLLM engine, but no model weights can
be downloaded here. Random weights cost the same compute per token as trained
ones, and the scheduler only sees token ids and KV blocks, so a small Qwen2
(the architecture of Qwen2.5) with a byte-level BPE tokenizer trained
in-process is enough. The tokenizer carries the ChatML and Hermes tool-call
tokens and a Qwen2.5-style chat template with tool support, so
``--tool-call-parser hermes`` can parse calls (with a random model, only under
guided decoding: ``tool_choice="required"`` or a named tool,
``parallel_tool_calls=False``). A fixed logit bias baked into the weights
(see weights.py) makes such calls compact and start with the single
``<tool_call>`` token, as trained Hermes/Qwen models do.

Output is deterministic (fixed seeds). ``build_tiny_model`` is idempotent: a
directory that holds a complete model from the same build fingerprint is
returned at once; a build takes a few seconds. Serve it with
``--dtype float32`` on CPU (vLLM would otherwise run it in bfloat16, slower
on AVX2-only machines).

    corpus.py         the seeded text the tokenizer is trained on
    tokenizer.py      byte-level BPE with the ChatML and tool-call tokens
    chat_template.py  Qwen2.5's chat template with Hermes tool calls
    weights.py        the random Qwen2 and its logit bias
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from vllm_continuum.tools.atomic_dir import replacing_dir
from vllm_continuum.tools.tiny_model.chat_template import CHAT_TEMPLATE
from vllm_continuum.tools.tiny_model.families import SERVED
from vllm_continuum.tools.tiny_model.tokenizer import (
    EOS_TOKEN,
    QWEN2_SPLIT,
    SPECIAL_TOKENS,
    TOKENIZER_SPEC,
    TOOL_TOKENS,
    build_tokenizer,
)
from vllm_continuum.tools.tiny_model.weights import MODEL_SPEC, build_weights

__all__ = ["build_tiny_model", "is_complete"]

# Bump when the corpus generator or the build steps change in a way the
# fingerprint below does not see (the spec and the template are hashed).
BUILD_VERSION = "3"
MARKER_FILE = ".vllm_continuum_tiny_model.json"
SEED = 1234

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _fingerprint(family: str | None = None) -> str:
    served = {"family": family, "served": SERVED[family]} if family else {}
    blob = json.dumps(
        {
            **served,
            "build_version": BUILD_VERSION,
            "seed": SEED,
            "model": MODEL_SPEC,
            "tokenizer": TOKENIZER_SPEC,
            "special": SPECIAL_TOKENS,
            "tool": TOOL_TOKENS,
            "eos": EOS_TOKEN,
            "template": CHAT_TEMPLATE,
            "split": QWEN2_SPLIT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_complete(path: str | os.PathLike, family: str | None = None) -> bool:
    """True if ``path`` holds a complete model built with this fingerprint."""
    p = pathlib.Path(path)
    try:
        marker = json.loads((p / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("fingerprint") == _fingerprint(family) and all(
        (p / f).is_file() for f in REQUIRED_FILES
    )


def build_tiny_model(
    path: str | os.PathLike, *, force: bool = False, family: str | None = None
) -> pathlib.Path:
    """Write the tiny model to ``path`` (a directory) and return it, resolved.
    ``family``: a tool-call family of ``families.SERVED`` (Kimi K2) instead of
    Hermes: its tokens and chat template, the same weights otherwise.

    Returns at once if ``path`` already holds a complete model of this build
    fingerprint, unless ``force``. The model is built in a temporary sibling
    directory and moved into place, so an interrupted or concurrent build
    never leaves a half-written model behind. A non-empty directory that was
    not written by this function is never deleted: FileExistsError.
    """
    target = pathlib.Path(path).expanduser().resolve()
    if not force and is_complete(target, family):
        return target
    if target.exists():
        if not target.is_dir():
            raise FileExistsError(f"{target} exists and is not a directory")
        if any(target.iterdir()) and not (target / MARKER_FILE).exists():
            raise FileExistsError(f"{target} is not empty and was not written by build_tiny_model")
    complete = None if force else (lambda p: is_complete(p, family))
    with replacing_dir(target, is_complete=complete) as tmp:
        if family:
            tokens, template = SERVED[family]
            tokenizer = build_tokenizer(tmp, SEED, MODEL_SPEC["max_position_embeddings"], tokens,
                                        special=True, template=template)
        else:
            tokenizer = build_tokenizer(tmp, SEED, MODEL_SPEC["max_position_embeddings"])
        build_weights(tmp, tokenizer, SEED)
        marker = {
            "fingerprint": _fingerprint(family),
            "build_version": BUILD_VERSION,
            "architecture": "Qwen2ForCausalLM",
            "vocab_size": len(tokenizer),
            "tool_token_ids": {t: tokenizer.convert_tokens_to_ids(t)
                               for t in (SERVED[family][0] if family else TOOL_TOKENS)},
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
    return target
