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
(see ``_add_logit_bias``) makes such calls compact and start with the single
``<tool_call>`` token, as trained Hermes/Qwen models do.

Output is deterministic (fixed seeds). ``build_tiny_model`` is idempotent: a
directory that holds a complete model from the same build fingerprint is
returned at once; a build takes a few seconds. Serve it with
``--dtype float32`` on CPU (vLLM would otherwise run it in bfloat16, slower
on AVX2-only machines).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
from typing import Any

from vllm_continuum.atomic_dir import replacing_dir

__all__ = [
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "build_tiny_model",
    "is_complete",
]

# Bump when the corpus generator or the build steps change in a way the
# fingerprint below does not see (the spec and the template are hashed).
BUILD_VERSION = "3"
MARKER_FILE = ".vllm_continuum_tiny_model.json"
SEED = 1234

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Like Qwen2.5: added (single) tokens, but not "special", so they survive
# skip_special_tokens and are matched by text in prompts and grammars.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

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
# The corpus runs out of merges first: the vocabulary ends at about 2.4k.
TOKENIZER_SPEC: dict[str, Any] = {"vocab_size": 3072, "min_frequency": 2, "corpus_docs": 6000}

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

# Qwen2.5-Instruct's template (Hermes tool format), made tolerant of
# ``content: null`` and of arguments given as a JSON string or an object.
CHAT_TEMPLATE = r"""{%- macro text(c) -%}
{%- if c is none -%}{%- elif c is string -%}{{- c -}}
{%- else -%}{%- for part in c -%}{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- text(messages[0]['content']) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + text(messages[0]['content']) + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + text(message.content) }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- text(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501

_WORDS = """
the of and to in is it you that he was for on are with as his they be at one
have this from or had by word but what some we can out other were all there
when up use your how said an each she which do their time if will way about
many then them write would like so these her long make thing see him two has
look more day could go come did number sound no most people my over know water
than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say
help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port
large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother
world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run while press close night real life few north open
weather forecast search query file path read write list result error value
status request response session tool call function argument user assistant
system message content model token cache block memory server client agent
temperature celsius fahrenheit unit location date today tomorrow price stock
order item quantity total account email send schedule meeting calendar event
""".split()

_KEYS = """id name type value count items data status error message result
query city unit path content text url limit offset page size enabled tags
created updated user email score price arguments description parameters
properties required enum""".split()

_IDENTS = """x y i n data result items value config request response client
session cache block token model path text buf node key acc total count""".split()


def _json_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth > 2 or kind < 0.25:
        return rng.choice(_WORDS)
    if kind < 0.45:
        return rng.randint(-50, 5000)
    if kind < 0.55:
        return round(rng.uniform(-100, 100), rng.randint(0, 3))
    if kind < 0.62:
        return rng.choice([True, False, None])
    if kind < 0.8:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(_KEYS): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!", ","])


def _code(rng: random.Random) -> str:
    fn = "_".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    a, b = rng.sample(_IDENTS, 2)
    lines = [f"def {fn}({a}, {b}={rng.randint(0, 9)}):"]
    for _ in range(rng.randint(1, 5)):
        c = rng.choice(_IDENTS)
        lines.append(
            rng.choice(
                [
                    f"    {c} = {a} + {b} * {rng.randint(1, 99)}",
                    f"    if {a} is None:\n        return {rng.choice(['None', '[]', '{}', '0'])}",
                    f"    for {c} in {b}:\n        {a}.append({c})",
                    f"    {c} = {json.dumps(_json_value(rng, 1))}",
                    f'    print(f"{{{a}}} {rng.choice(_WORDS)}")',
                    f"    return {{'{rng.choice(_KEYS)}': {a}, '{rng.choice(_KEYS)}': {b}}}",
                ]
            )
        )
    return "\n".join(lines) + "\n"


def _tool_schema_json(rng: random.Random) -> str:
    props = {
        k: rng.choice(
            [
                {"type": "string", "description": _sentence(rng)},
                {"type": "integer"},
                {"type": "string", "enum": rng.sample(_WORDS, 3)},
            ]
        )
        for k in rng.sample(_KEYS, rng.randint(1, 3))
    }
    fn = "_".join(rng.sample(_WORDS, 2))
    return json.dumps(
        {
            "type": "function",
            "function": {
                "name": fn,
                "description": _sentence(rng),
                "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
            },
        }
    )


def _corpus(n_docs: int, seed: int) -> list[str]:
    """English-ish prose, JSON, code and chat turns. Special and tool tokens
    are left out: the trainer does not split them off, so they would leak
    into merges such as ``.<|``."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.35:
            docs.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 6))))
        elif kind < 0.6:
            indent = rng.choice([None, None, 2])
            docs.append(
                json.dumps(
                    _json_value(rng, 0)
                    if rng.random() < 0.3
                    else {k: _json_value(rng, 1) for k in rng.sample(_KEYS, 3)},
                    indent=indent,
                )
            )
        elif kind < 0.75:
            docs.append(_code(rng))
        elif kind < 0.85:
            args = {rng.choice(_KEYS): _json_value(rng, 2) for _ in range(rng.randint(1, 3))}
            name = "_".join(rng.sample(_WORDS, 2))
            docs.append(json.dumps({"name": name, "arguments": args}))
        elif kind < 0.92:
            docs.append(_tool_schema_json(rng))
        else:
            docs.append(f"user\n{_sentence(rng)}\nassistant\n{_sentence(rng)} {_sentence(rng)}\n")
    return docs


def _fingerprint() -> str:
    blob = json.dumps(
        {
            "build_version": BUILD_VERSION,
            "seed": SEED,
            "model": MODEL_SPEC,
            "tokenizer": TOKENIZER_SPEC,
            "special": SPECIAL_TOKENS,
            "tool": TOOL_TOKENS,
            "eos": EOS_TOKEN,
            "template": CHAT_TEMPLATE,
            "split": _QWEN2_SPLIT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_complete(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a complete model built with this fingerprint."""
    p = pathlib.Path(path)
    try:
        marker = json.loads((p / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("fingerprint") == _fingerprint() and all(
        (p / f).is_file() for f in REQUIRED_FILES
    )


def _build_tokenizer(out: pathlib.Path) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    # Qwen2's normalizer and pre-tokenizer: transformers 5 loads this directory
    # as Qwen2Tokenizer (from config.json's model_type), which imposes them, so
    # training with anything else would make the two loaders disagree.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SPEC["vocab_size"] - len(TOOL_TOKENS),
        min_frequency=TOKENIZER_SPEC["min_frequency"],
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(TOKENIZER_SPEC["corpus_docs"], SEED), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=MODEL_SPEC["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)
    return hf_tok


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


def _build_model(out: pathlib.Path, tokenizer: Any) -> None:
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
        torch.manual_seed(SEED)
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


def build_tiny_model(path: str | os.PathLike, *, force: bool = False) -> pathlib.Path:
    """Write the tiny model to ``path`` (a directory) and return it, resolved.

    Returns at once if ``path`` already holds a complete model of this build
    fingerprint, unless ``force``. The model is built in a temporary sibling
    directory and moved into place, so an interrupted or concurrent build
    never leaves a half-written model behind. A non-empty directory that was
    not written by this function is never deleted: FileExistsError.
    """
    target = pathlib.Path(path).expanduser().resolve()
    if not force and is_complete(target):
        return target
    if target.exists():
        if not target.is_dir():
            raise FileExistsError(f"{target} exists and is not a directory")
        if any(target.iterdir()) and not (target / MARKER_FILE).exists():
            raise FileExistsError(f"{target} is not empty and was not written by build_tiny_model")
    with replacing_dir(target, is_complete=None if force else is_complete) as tmp:
        tokenizer = _build_tokenizer(tmp)
        _build_model(tmp, tokenizer)
        marker = {
            "fingerprint": _fingerprint(),
            "build_version": BUILD_VERSION,
            "architecture": "Qwen2ForCausalLM",
            "vocab_size": len(tokenizer),
            "tool_token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in TOOL_TOKENS},
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
    return target
