"""The tiny model's tokenizer: byte-level BPE trained in-process, Qwen2-style,
with the ChatML tokens and the Hermes tool-call tokens."""

from __future__ import annotations

import pathlib
from typing import Any

from vllm_continuum.tools.tiny_model.chat_template import CHAT_TEMPLATE
from vllm_continuum.tools.tiny_model.corpus import training_corpus

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Like Qwen2.5: added (single) tokens, but not "special", so they survive
# skip_special_tokens and are matched by text in prompts and grammars.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# The corpus runs out of merges first: the vocabulary ends at about 2.4k.
TOKENIZER_SPEC: dict[str, Any] = {"vocab_size": 3072, "min_frequency": 2, "corpus_docs": 6000}

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer(out: pathlib.Path, seed: int, model_max_length: int,
                    tool_tokens: tuple[str, ...] = TOOL_TOKENS, special: bool = False,
                    template: str = CHAT_TEMPLATE) -> Any:
    """Train the tokenizer on the seeded corpus and save it (with the chat
    template) to ``out``; returns it as a transformers tokenizer. Another
    family's model gives its own `tool_tokens` (`special` as its real
    tokenizer has them) and chat template."""
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
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SPEC["vocab_size"] - len(TOOL_TOKENS),  # the same merges for all
        min_frequency=TOKENIZER_SPEC["min_frequency"],
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(TOKENIZER_SPEC["corpus_docs"], seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t in tool_tokens])

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = template
    hf_tok.save_pretrained(out)
    return hf_tok
