"""Tool calls with real tokenizers: Gemma 4, Llama 3 and Qwen2, served by
vLLM's real scheduler (sync and async, both builds) from llama.cpp's
vocabulary files (tests/scheduler/real_vocab.py: fetched by scripts/setup.sh).

Each served tokenizer is first checked to give llama.cpp's reference ids for
its reference texts (the model's own tokenizer's ids), so the vocabulary, the
ids and the tokenization are the real model's. Then, with the shipped
defaults: the family the start-up lookup finds in it (none where the model
has no tool-call token), its exact tool-call text, tokenized by that
tokenizer, pinned and the tool named (the next turn cached after traffic
cycled the pool); a plain answer not pinned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.scheduler.harness import BLOCK_SIZE, make_request
from tests.scheduler.harness import tokens as ids
from tests.scheduler.real_vocab import STAMP, VOCABS, cache_dir
from tests.scheduler.test_tool_call_families import PROMPT, driver, resumed_hit

CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
ANSWER = "It is sunny in Paris: 21 °C, and no rain is expected."


@pytest.fixture(scope="session")
def real_vocab() -> Path:
    folder = cache_dir()
    if not (folder / STAMP).is_file():
        reason = (f"llama.cpp's vocabulary files are not in {folder}: fetch them with "
                  "`python -m tests.scheduler.real_vocab` (scripts/setup.sh does)")
        if os.environ.get("CONTINUUM_REAL_VOCAB_REQUIRED"):  # scripts/test.sh: CI runs them
            pytest.fail(reason)
        pytest.skip(reason)
    return folder


@pytest.fixture(scope="session")
def real_dirs(real_vocab, tiny_model_dir, tmp_path_factory):
    """A model folder per vocabulary: its tokenizer, the tiny model's config
    sized to it (the scheduler loads no weights)."""
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    dirs = {}
    for name in VOCABS:
        target = tmp_path_factory.mktemp(name)
        spec = (real_vocab / name / "tokenizer.json").read_text()
        (target / "tokenizer.json").write_text(spec)
        (target / "tokenizer_config.json").write_text(json.dumps(
            {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend",
             "clean_up_tokenization_spaces": False}))
        size = len(json.loads(spec)["model"]["vocab"])
        # As a Llama: for Qwen2, transformers would rebuild the tokenizer as Qwen2's.
        (target / "config.json").write_text(json.dumps({
            **config, "vocab_size": size, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"]}))
        dirs[name] = str(target)
    return dirs


def served(real_vocab, real_dirs, name, async_scheduling, **settings):
    """The driver, its served tokenizer checked against llama.cpp's reference."""
    d = driver(real_dirs[name], async_scheduling, **settings)
    tokenizer = d.scheduler.structured_output_manager.tokenizer
    texts = (real_vocab / name / "reference.inp").read_text().split("\n__ggml_vocab_test__\n")
    want = [list(map(int, line.split()))
            for line in (real_vocab / name / "reference.out").read_text().split("\n")[:len(texts)]]
    got = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert len(texts) > 40 and got == want
    return d, tokenizer


def run(d, session: str, prompt: list[int], output: list[int]):
    """A turn whose output is `output`, ending in its last token (a stop token
    of the model, kept in the output as vLLM keeps it)."""
    request = make_request(prompt, session=session, max_tokens=256)
    request.sampling_params.stop_token_ids = [output[-1]]
    d.add(request, output)
    d.run_until_finished(request)
    assert list(request.output_token_ids) == output
    return request


def answered(d, answer: list[int]) -> None:
    """A plain answer (the session's first turn) is not pinned."""
    run(d, "B", ids(3000, PROMPT), answer)
    assert d.scheduler.continuum.pins.get("B") is None
    assert d.scheduler.continuum.stats.session_turns == {("answer", "none"): 1}


def called(d, first, tool: str, fmt: str) -> None:
    """The call is pinned and named, and its next turn cached after other traffic."""
    assert d.scheduler.continuum.pins.get(first.session_id).tool == tool
    assert d.scheduler.continuum.stats.session_turns[("tool_call", fmt)] == 1
    assert resumed_hit(d, first) >= PROMPT // BLOCK_SIZE * BLOCK_SIZE


def test_gemma4(real_vocab, real_dirs, async_scheduling):
    """Gemma 4's call tokens are single tokens (<|tool_call> 48, <tool_call|> 49,
    the string quote <|"|> 52); the turn ends with <|tool_response> (50)."""
    d, tokenizer = served(real_vocab, real_dirs, "gemma-4", async_scheduling)
    vocab = tokenizer.get_vocab()
    assert [vocab[t] for t in ("<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>")] == [
        48, 49, 52, 50]
    assert d.scheduler._tool_calls.found == ["gemma4"]
    call = tokenizer.encode('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
                            "<|tool_response>", add_special_tokens=False)
    assert call[0] == 48 and call[-2:] == [49, 50]
    answered(d, tokenizer.encode(ANSWER + "<turn|>", add_special_tokens=False))
    called(d, run(d, "A", ids(1000, PROMPT), call), "get_weather", "gemma4")


def test_llama3(real_vocab, real_dirs, async_scheduling):
    """Llama 3's vocabulary holds no tool-call token (128010, Llama 3.1's
    <|python_tag|>, is still reserved here): its JSON calls are text, pinned
    with `tool_call_parser: llama3_json`, and only then."""
    d, tokenizer = served(real_vocab, real_dirs, "llama-bpe", async_scheduling,
                          tool_call_parser="llama3_json")
    vocab = tokenizer.get_vocab()
    assert vocab["<|eot_id|>"] == 128009 and "<|python_tag|>" not in vocab
    assert d.scheduler._tool_calls.found == []
    call = tokenizer.encode(CALL + "<|eot_id|>", add_special_tokens=False)
    answered(d, tokenizer.encode(ANSWER + "<|eot_id|>", add_special_tokens=False))
    called(d, run(d, "A", ids(1000, PROMPT), call), "get_weather", "llama3_json")
    plain = driver(real_dirs["llama-bpe"], async_scheduling)  # no setting: a text call is not seen
    run(plain, "C", ids(1000, PROMPT), call)
    assert plain.scheduler.continuum.stats.session_turns == {("answer", "none"): 1}


def test_qwen2(real_vocab, real_dirs, async_scheduling):
    """Qwen2's vocabulary has no <tool_call> token (Qwen2.5 added it, 151657):
    the Hermes call is spelled out of ordinary tokens, found with
    `tool_call_parser: hermes`, and only then."""
    d, tokenizer = served(real_vocab, real_dirs, "qwen2", async_scheduling,
                          tool_call_parser="hermes")
    assert tokenizer.get_vocab()["<|im_end|>"] == 151645
    assert d.scheduler._tool_calls.found == []
    call = tokenizer.encode(f"<tool_call>\n{CALL}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert len(tokenizer.encode("<tool_call>", add_special_tokens=False)) > 1
    answered(d, tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False))
    called(d, run(d, "A", ids(1000, PROMPT), call), "get_weather", "hermes")
    plain = driver(real_dirs["qwen2"], async_scheduling)
    run(plain, "C", ids(1000, PROMPT), call)
    assert plain.scheduler.continuum.stats.session_turns == {("answer", "none"): 1}
