"""The tool-call detector on real (tiny, trained) tokenizers, without a
scheduler: what it reads, what it never decodes, forced calls, the hints and
settings that steer it, and the start-up line (core/tool_calls/)."""

from __future__ import annotations

import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_continuum.config import TEXT_TOOL_CALL_PATTERNS, ConfigError, load_config
from vllm_continuum.core.hints import parse_hints
from vllm_continuum.core.tool_calls import PARSERS, ToolCall, ToolCallDetector, describe
from vllm_continuum.core.tool_calls.detector import MAX_SPELLED_TRIES
from vllm_continuum.core.tool_calls.positions import HEAD, TAIL
from vllm_continuum.core.tool_calls.patterns import required_char
from vllm_continuum.tools.tiny_model.families import SAMPLES, sample_tokenizer


class Counting:
    """A tokenizer that counts the tokens it decodes."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.decoded = tokenizer, 0
        self.backend_tokenizer = getattr(tokenizer, "backend_tokenizer", None)

    def get_vocab(self):
        return self.inner.get_vocab()

    def decode(self, ids):
        self.decoded += len(ids)
        return self.inner.decode(ids)

    def encode(self, text):
        return self.inner.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def tokenizer_of(tiny_model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("families")
    loaded = {}

    def load(key: str) -> Counting:
        if key not in loaded:
            loaded[key] = AutoTokenizer.from_pretrained(str(sample_tokenizer(tiny_model_dir, key, root / key)))
        return Counting(loaded[key])

    return load


def words(tok: Counting, n: int) -> list[int]:
    """`n` tokens of an ordinary answer."""
    ids = tok.encode("The weather in Paris is mild and the forecast says sun, " * (n // 8 + 1))
    return ids[:n]


@pytest.mark.parametrize("key", [k for k, s in SAMPLES.items() if not s.needs_parser])
def test_each_family_is_read_with_no_setting(tokenizer_of, key):
    sample, tok = SAMPLES[key], tokenizer_of(key)
    detector = ToolCallDetector(tok)
    assert detector.tool_called(tok.encode(sample.call)) == ToolCall(sample.tool, sample.shown_format)
    assert detector.tool_called(tok.encode(sample.answer)) is None


@pytest.mark.parametrize("key", [k for k, s in SAMPLES.items() if s.needs_parser])
def test_text_formats_are_read_with_the_parser_only(tokenizer_of, key):
    sample, tok = SAMPLES[key], tokenizer_of(key)
    call = tok.encode(sample.call)
    assert ToolCallDetector(tok).tool_called(call) is None
    expected = ToolCall(sample.tool, sample.shown_format)
    assert ToolCallDetector(tok, parser=sample.parser).tool_called(call) == expected
    assert ToolCallDetector(tok).tool_called(call, parser=sample.parser) == expected  # the hint
    assert ToolCallDetector(tok, parser=sample.parser).tool_called(tok.encode(sample.answer)) is None


def test_a_text_format_call_after_the_reasoning(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from vllm_continuum.tools.tiny_model.families import family_tokenizer

    tok = Counting(AutoTokenizer.from_pretrained(str(family_tokenizer(
        tiny_model_dir, ("<think>", "</think>"), tmp_path / "thinking"))))
    call = [*tok.encode("<think>The user wants the weather: call the tool.</think>\n"),
            *tok.encode(SAMPLES["llama3_json"].call)]
    assert ToolCallDetector(tok, parser="llama3_json").tool_called(call) == ToolCall(
        "get_weather", "llama3_json")


def test_answers_are_never_decoded(tokenizer_of):
    tok = tokenizer_of("hermes")
    detector = ToolCallDetector(tok, patterns=TEXT_TOOL_CALL_PATTERNS)
    answer = words(tok, 6000)
    assert detector.tool_called(answer) is None and tok.decoded == 0
    call = answer + tok.encode(SAMPLES["hermes"].call)
    assert detector.tool_called(call).name == "get_weather"
    assert tok.decoded <= 64  # the window after the marker only


def test_a_text_pattern_decodes_only_outputs_that_may_match(tokenizer_of):
    tok = tokenizer_of("hermes")
    detector = ToolCallDetector(tok, patterns=TEXT_TOOL_CALL_PATTERNS)
    shell = tok.encode("THOUGHT: look first.\n\n```mswea_bash_command\nls -la\n```")
    assert detector.tool_called(shell) == ToolCall("ls", "pattern")
    decoded = tok.decoded
    assert detector.tool_called(tok.encode("No backtick here.")) is None
    assert tok.decoded == decoded


@pytest.mark.parametrize("pattern,char", [
    (TEXT_TOOL_CALL_PATTERNS[0], "`"),
    (r"x(\w+)", "x"),
    (r"(?i)x(\w+)", None),  # case-insensitive: not one character
    (r"(a|b)(\w+)", None),  # no literal at the top level
    (r" (\w+)", None),  # a space is not printable ASCII here
])
def test_required_char(pattern, char):
    assert required_char(re.compile(pattern)) == char


def spelled(tok: Counting, text: str) -> list[int]:
    """`text` with its `<tool_call>` written out of ordinary tokens, as guided
    decoding may write it."""
    head, _, rest = text.partition("<tool_call>")
    return [*tok.encode(head), *tok.encode("<tool_call"), *tok.encode(">" + rest)]


def test_a_spelled_marker_is_read_at_the_start_and_the_end(tokenizer_of):
    tok = tokenizer_of("hermes")
    detector = ToolCallDetector(tok)
    call = spelled(tok, SAMPLES["hermes"].call)
    marker = tok.get_vocab()["<tool_call>"]
    assert marker not in call
    filler = words(tok, 3000)
    assert detector.tool_called(call + filler) == ToolCall("get_weather", "hermes")  # forced
    assert detector.tool_called(filler + call) == ToolCall("get_weather", "hermes")  # auto
    # Only the start and the end are looked at (a bound, documented).
    middle = filler[:HEAD + 10] + call + filler[:TAIL + 10]
    assert detector.tool_called(middle) is None


def test_an_answer_full_of_spelling_starts_decodes_a_bounded_window(tokenizer_of):
    tok = tokenizer_of("hermes")
    detector = ToolCallDetector(tok)
    html = tok.encode("<div><span>a < b</span></div> " * 400)
    assert detector.tool_called(html) is None
    assert tok.decoded <= MAX_SPELLED_TRIES * 16


def test_forced_calls_are_calls_named_from_their_json(tokenizer_of):
    tok = tokenizer_of("pythonic")  # no marker in this vocabulary
    detector = ToolCallDetector(tok)
    required = tok.encode('[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    assert detector.tool_called(required) is None
    assert detector.tool_called(required, forced=True) == ToolCall("get_weather", "forced")
    bare_arguments = tok.encode('{"city": "Paris"}')  # a named tool, guided
    assert detector.tool_called(bare_arguments, forced=True) == ToolCall("unknown", "forced")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def test_configured_tokens_and_the_deprecated_one(tokenizer_of):
    tok = tokenizer_of("pythonic")
    records = Records()
    logging.getLogger("vllm.continuum").addHandler(records)
    try:
        assert load_config(use_env=False, tool_call_tokens=["<call>"], tool_call_token="<x>"
                           ).all_tool_call_tokens == ["<call>", "<x>"]
    finally:
        logging.getLogger("vllm.continuum").removeHandler(records)
    assert any("tool_call_token is deprecated" in m for m in records.messages)
    detector = ToolCallDetector(tok, tokens=["<|endoftext|>"])
    call = [*tok.encode('Sure.'), tok.get_vocab()["<|endoftext|>"], *tok.encode('{"name": "x"}')]
    assert detector.tool_called(call) == ToolCall("x", "token")


def test_patterns_add_to_the_built_in_ones_unless_removed():
    mine = r"```bash\s*\n\s*(\w+)"
    assert load_config(use_env=False, tool_call_patterns=[mine]).all_tool_call_patterns == [
        *TEXT_TOOL_CALL_PATTERNS, mine]
    assert load_config(use_env=False, tool_call_patterns=[mine], default_tool_call_patterns=False
                       ).all_tool_call_patterns == [mine]


def test_an_unknown_parser_is_refused_at_start_with_the_known_ones():
    with pytest.raises(ConfigError, match="llama3_json") as error:
        load_config(use_env=False, tool_call_parser="jamba")
    assert "tool_call_tokens" in str(error.value)
    assert load_config(use_env=False, tool_call_parser="pythonic").tool_call_parser == "pythonic"


def test_the_hints_of_a_tool_call():
    hints = parse_hints({"continuum_tool_parser": "llama3_json", "continuum_tool_choice": "required"}, 128)
    assert (hints.tool_parser, hints.tool_forced, hints.invalid) == ("llama3_json", True, ())
    bad = parse_hints({"continuum_tool_parser": "jamba", "continuum_tool_choice": "auto"}, 128)
    assert (bad.tool_parser, bad.tool_forced) == (None, False)
    assert bad.invalid == ("continuum_tool_parser", "continuum_tool_choice")


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["continuum_tool_parser", "continuum_tool_choice", "x"]),
                       st.none() | st.booleans() | st.integers() | st.text() | st.sampled_from(
                           [*PARSERS, "required"])))
def test_tool_hints_never_raise_and_are_known_or_dropped(xargs):
    hints = parse_hints(xargs, 128)
    assert hints.tool_parser is None or hints.tool_parser in PARSERS
    assert hints.tool_forced == (xargs.get("continuum_tool_choice") == "required")


def test_the_start_up_line_says_what_was_found(tokenizer_of):
    level, message = describe(ToolCallDetector(tokenizer_of("kimi_k2")))
    assert level == logging.INFO
    assert "markers of kimi_k2 in the vocabulary" in message and "<|tool_call_begin|>=" in message
    _, message = describe(ToolCallDetector(tokenizer_of("glm45")))
    assert "markers of hermes/qwen3_coder/glm45 in the vocabulary (<tool_call>=" in message


def test_the_start_up_warning_says_which_setting_is_needed(tokenizer_of):
    level, message = describe(ToolCallDetector(tokenizer_of("pythonic"), patterns=TEXT_TOOL_CALL_PATTERNS))
    assert level == logging.WARNING
    assert "no tool-call marker of a known format" in message
    assert "set tool_call_parser" in message and "ClientSessionMiddleware" in message
    level, message = describe(ToolCallDetector(tokenizer_of("pythonic"), parser="pythonic"))
    assert level == logging.INFO and "tool_call_parser pythonic" in message
    level, message = describe(ToolCallDetector(tokenizer_of("hermes"), tokens=["<nope>"]))
    assert level == logging.WARNING and "'<nope>'" in message
    level, message = describe(ToolCallDetector(None))
    assert level == logging.WARNING and "no tokenizer" in message


class Odd:
    """A tokenizer of an unknown kind: a tiktoken-style vocabulary (bytes) and
    a decoder that fails."""

    def get_vocab(self):
        return {b"<tool_call>": 5, "<|call|>": 6, 7: 8}

    def decode(self, ids):
        raise RuntimeError("cannot decode")


def test_an_odd_tokenizer_never_fails_a_turn():
    detector = ToolCallDetector(Odd(), parser="llama3_json", patterns=TEXT_TOOL_CALL_PATTERNS)
    assert detector.found == ["openai"]
    assert detector.tool_called([1, 5, 6]) == ToolCall("unknown", "openai")
    assert detector.tool_called([1, 2, 3], forced=True) == ToolCall("unknown", "forced")
    assert detector.tool_called([1, 2, 3]) is None
    assert detector.tool_called(None) is None  # (not a sequence: logged, read as no call)
