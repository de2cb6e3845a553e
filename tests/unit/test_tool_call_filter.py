"""ToolCallDetector decodes an output for text-mode patterns only if one of its
tokens spells a character every match needs (exact for byte-level BPE)."""

import re

import pytest

from vllm_continuum.config import TEXT_TOOL_CALL_PATTERNS
from vllm_continuum.core.tool_calls import ToolCallDetector, _required_char


class ByteLevel:  # what the filter checks: the backend's decoder type's name
    pass


class Metaspace:
    pass


class FakeTokenizer:
    def __init__(self, vocab, decoder):
        self.vocab, self.decodes = vocab, 0
        self.backend_tokenizer = type("Backend", (), {"decoder": decoder})()
        self.pieces = {i: t for t, i in vocab.items()}

    def get_vocab(self):
        return dict(self.vocab)

    def decode(self, ids):
        self.decodes += 1
        return "".join(self.pieces.get(i, "") for i in ids)


VOCAB = {"```": 1, "mswea_bash_command": 2, "\n": 3, "ls": 4, "hello": 5, " world": 6, "<tool_call>": 7}


@pytest.mark.parametrize("pattern,char", [
    (TEXT_TOOL_CALL_PATTERNS[0], "`"),
    (r"x(\w+)", "x"),
    (r"(?i)x(\w+)", None),  # case-insensitive: not one character
    (r"(a|b)(\w+)", None),  # no literal at the top level
    (r" (\w+)", None),  # a space is not spelled as itself by byte-level vocabularies
])
def test_required_char(pattern, char):
    assert _required_char(re.compile(pattern)) == char


def test_outputs_without_a_needed_token_are_not_decoded():
    tok = FakeTokenizer(VOCAB, ByteLevel())
    detector = ToolCallDetector(tok, "<tool_call>", TEXT_TOOL_CALL_PATTERNS)
    assert detector.tool_called([5, 6]) is None
    assert tok.decodes == 0
    assert detector.tool_called([5, 1, 2, 3, 4]) == "ls"
    assert detector.tool_called([5, 1, 6]) is None  # decoded: a backtick, but no match
    assert tok.decodes == 2


def test_other_tokenizers_always_decode():
    tok = FakeTokenizer(VOCAB, Metaspace())
    detector = ToolCallDetector(tok, "<tool_call>", TEXT_TOOL_CALL_PATTERNS)
    assert detector.tool_called([5, 6]) is None
    assert tok.decodes == 1
