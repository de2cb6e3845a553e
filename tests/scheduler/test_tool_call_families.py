"""Every tool-call format vLLM parses, at the scheduler: vLLM's real
scheduler (sync and async, both builds), a tokenizer holding the family's
markers as single tokens (as its real tokenizer does), the family's exact
tool-call text as the output, the shipped defaults and no hint.

A family's call is pinned and named, and the session's next turn finds its
context cached after other traffic cycled the pool; its plain answer is not
pinned (and the same traffic then evicts the context: the cycling is real),
and its call text only in the prompt pins nothing. Text formats need the one
setting, `tool_call_parser`, or the hint the middleware sends. mistral-common's
Tekken, a real tokenizer that ships offline, is served by vLLM's own Mistral
tokenizer class. Formats and samples: vllm_continuum/tools/tiny_model/families.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.scheduler.harness import (
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    Driver,
    FakeClock,
    admitted_hit,
    audit,
    make_request,
    next_turn,
    tokens,
)
from vllm_continuum.tools.tiny_model.families import SAMPLES, sample_tokenizer

MARKED = [k for k, s in SAMPLES.items() if not s.needs_parser]
TEXT = [k for k, s in SAMPLES.items() if s.needs_parser]
NUM_BLOCKS, PROMPT = 40, 200


@pytest.fixture(scope="session")
def family_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-call-families")
    return {key: str(sample_tokenizer(tiny_model_dir, key, root / key)) for key in SAMPLES}


def driver(model_dir: str, async_scheduling: bool, **settings) -> Driver:
    from tests.scheduler.harness import make_scheduler

    scheduler = make_scheduler(model_dir, num_blocks=NUM_BLOCKS, async_scheduling=async_scheduling,
                               settings=settings)
    scheduler.continuum.clock = FakeClock()
    d = Driver(scheduler)
    step = d.step
    d.step = lambda: (step(), audit(scheduler))[0]
    return d


def encode(d: Driver, text: str) -> list[int]:
    return d.scheduler.structured_output_manager.tokenizer.encode(text, add_special_tokens=False)


def turn(d: Driver, session: str, prompt: list[int], text: str, stops=(), **kw):
    """A request whose output is `text`, ending as the family's turns end:
    with the end-of-sequence token, or on its own stop token (kept in the
    output, as vLLM keeps it)."""
    request = make_request(prompt, session=session, max_tokens=256, **kw)
    vocab = d.scheduler.structured_output_manager.tokenizer.get_vocab()
    request.sampling_params.stop_token_ids = [vocab[t] for t in stops]
    script = encode(d, text)
    d.add(request, script if script[-1] in request.sampling_params.stop_token_ids
          else [*script, EOS_TOKEN_ID])
    d.run_until_finished(request)
    assert list(request.output_token_ids[:len(script)]) == script
    return request


def cycle_pool(d: Driver) -> None:
    """Other users' traffic: more distinct blocks than the pool holds."""
    for i in range(4):
        other = make_request(tokens(7000 + 600 * i, 300), max_tokens=2)
        d.add(other)
        d.run_until_finished(other)


def resumed_hit(d: Driver, first) -> int:
    d.advance(2.0)  # the tool runs
    cycle_pool(d)
    second = next_turn(first)
    d.add(second)
    return admitted_hit(d, second)


@pytest.mark.parametrize("key", MARKED + TEXT)
def test_a_tool_call_is_pinned_named_and_its_context_kept(family_dirs, async_scheduling, key):
    sample = SAMPLES[key]
    settings = {"tool_call_parser": sample.parser} if sample.needs_parser else {}
    d = driver(family_dirs[key], async_scheduling, **settings)
    first = turn(d, "A", tokens(0, PROMPT), sample.call, sample.stops)
    pin = d.scheduler.continuum.pins.get("A")
    assert pin is not None and pin.tool == sample.tool
    assert d.scheduler.continuum.stats.session_turns == {("tool_call", sample.shown_format): 1}
    assert resumed_hit(d, first) >= PROMPT // BLOCK_SIZE * BLOCK_SIZE
    assert d.scheduler.continuum.stats.releases_by_reason == {"resumed": 1}


@pytest.mark.parametrize("key", TEXT)
def test_a_text_format_needs_its_parser_setting_or_the_middlewares_hint(
        family_dirs, async_scheduling, key):
    sample = SAMPLES[key]
    d = driver(family_dirs[key], async_scheduling)
    turn(d, "A", tokens(0, PROMPT), sample.call, sample.stops)
    assert d.scheduler.continuum.pins.get("A") is None
    hinted = turn(d, "B", tokens(3000, PROMPT), sample.call, sample.stops,
                  xargs={"continuum_tool_parser": sample.parser})
    assert d.scheduler.continuum.pins.get("B").tool == sample.tool
    assert d.scheduler.continuum.stats.session_turns == {
        ("answer", "none"): 1, ("tool_call", sample.shown_format): 1}
    assert hinted.is_finished()


@pytest.mark.parametrize("key", MARKED + TEXT)
def test_a_plain_answer_is_never_pinned_and_its_context_is_then_evicted(
        family_dirs, async_scheduling, key):
    sample = SAMPLES[key]
    settings = {"tool_call_parser": sample.parser} if sample.needs_parser else {}
    d = driver(family_dirs[key], async_scheduling, **settings)
    first = turn(d, "A", tokens(0, PROMPT), sample.answer, sample.stops)
    assert len(d.scheduler.continuum.pins) == 0
    assert d.scheduler.continuum.stats.session_turns == {("answer", "none"): 1}
    assert resumed_hit(d, first) < PROMPT // BLOCK_SIZE * BLOCK_SIZE


@pytest.mark.parametrize("key", MARKED)
def test_a_call_in_the_prompt_only_pins_nothing(family_dirs, async_scheduling, key):
    """A later turn's prompt holds the earlier call (the chat template writes
    it back); its own output is an answer."""
    sample = SAMPLES[key]
    d = driver(family_dirs[key], async_scheduling)
    prompt = [*tokens(0, PROMPT), *encode(d, sample.call), *tokens(100, 20)]
    turn(d, "A", prompt, sample.answer, sample.stops)
    assert len(d.scheduler.continuum.pins) == 0


@pytest.fixture(scope="session")
def tekken_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A model folder vLLM serves with its Mistral tokenizer (`tekken.json`
    beside `consolidated*.safetensors`): mistral-common's Tekken, 131k tokens,
    `[TOOL_CALLS]` = 9. The scheduler loads no weights: the file is empty."""
    mistral_common = pytest.importorskip("mistral_common")
    target = tmp_path_factory.mktemp("tekken")
    shutil.copy(Path(mistral_common.__file__).parent / "data/tekken_240911.json",
                target / "tekken.json")
    (target / "consolidated.safetensors").touch()
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "vocab_size": 131072}))
    return str(target)


def test_mistral_tekken_a_real_tokenizer(tekken_dir, async_scheduling):
    from vllm.tokenizers.mistral import MistralTokenizer

    d = driver(tekken_dir, async_scheduling)
    tokenizer = d.scheduler.structured_output_manager.tokenizer
    assert isinstance(tokenizer, MistralTokenizer) and tokenizer.get_vocab()["[TOOL_CALLS]"] == 9
    assert d.scheduler._tool_calls.found == ["mistral"]
    call = [9, *tokenizer.encode('[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
                                 add_special_tokens=False)]
    prompt = [1000 + i for i in range(PROMPT)]
    first = make_request(prompt, session="A", max_tokens=64)
    d.add(first, [*call, EOS_TOKEN_ID])
    d.run_until_finished(first)
    assert d.scheduler.continuum.pins.get("A").tool == "get_weather"
    answer = make_request([2000 + i for i in range(PROMPT)], session="B", max_tokens=64)
    d.add(answer, [*tokenizer.encode("It is sunny [in] Paris.", add_special_tokens=False),
                   EOS_TOKEN_ID])
    d.run_until_finished(answer)
    assert d.scheduler.continuum.pins.get("B") is None
    assert d.scheduler.continuum.stats.session_turns == {
        ("tool_call", "mistral"): 1, ("answer", "none"): 1}


def test_forced_calls_without_a_marker(family_dirs, async_scheduling):
    """A forced call made under guided JSON (a parser without a structural
    tag; no marker in the output). The engine core knows `required` from the
    schema vLLM built for it; the middleware's hints say the rest (a named
    tool: the bare arguments). A JSON answer with neither pins nothing."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    d = driver(family_dirs["pythonic"], async_scheduling)  # no marker in this vocabulary
    tool = ChatCompletionToolsParam.model_validate({"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}})
    listed = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    required = make_request(tokens(0, PROMPT), session="A", max_tokens=64)
    # What the engine core reads (the grammar itself is vLLM's, not run here).
    required.sampling_params.structured_outputs = StructuredOutputsParams(
        json=get_json_schema_from_tools("required", [tool]))
    d.add(required, [*encode(d, listed), EOS_TOKEN_ID])
    d.run_until_finished(required)
    turn(d, "B", tokens(1000, PROMPT), '{"city": "Paris"}', xargs={"continuum_tool": "get_weather"})
    turn(d, "C", tokens(2000, PROMPT), listed, xargs={"continuum_tool_choice": "required"})
    turn(d, "D", tokens(3000, PROMPT), '{"city": "Paris"}')
    stats = d.scheduler.continuum.stats
    assert stats.pins_by_tool == {"get_weather": 3}  # A, B, C (the small pool then takes two back)
    assert d.scheduler.continuum.pins.get("D") is None
    assert stats.session_turns == {
        ("tool_call", "forced"): 2, ("tool_call", "hint"): 1, ("answer", "none"): 1}


def test_an_invalid_parser_hint_is_ignored_and_counted(family_dirs, async_scheduling):
    sample = SAMPLES["llama3_json"]
    d = driver(family_dirs["llama3_json"], async_scheduling)
    turn(d, "A", tokens(0, PROMPT), sample.call, xargs={"continuum_tool_parser": "jamba"})
    assert d.scheduler.continuum.pins.get("A") is None
    assert d.scheduler.continuum.stats.invalid_hints == 1
