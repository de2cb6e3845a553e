"""`ToolCallDetector`: whether a finished turn's output called a tool, which,
and in which format, from its token ids.

Built once from the served tokenizer: every family's single-token markers
(families.py) that its vocabulary holds, the tokens a spelled marker can
begin with, the configured tokens and text patterns. Per finished turn, one
pass over the output's ids against that set (a set lookup per token); an
output that holds none of them is done with, undecoded. Only a hit decodes a
bounded window: the tokens after the first start marker (`NAME_TOKENS`), back
from an end token to where its message began, a spelled marker's few tokens.
Text formats and forced calls (a per-request `tool_call_parser` or
`tool_choice: required`) decode the message's first tokens only. Text
patterns decode the whole output, and only when a token spells a character
every match needs (patterns.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_continuum.core.tool_calls.families import (
    FAMILIES, FAMILY, JSON_NAME, PARSERS, TEXT_FORMATS, Family, NameReader,
)
from vllm_continuum.core.tool_calls.patterns import UNKNOWN_TOOL, TextPatterns
from vllm_continuum.core.tool_calls.positions import last_index, near_end, positions
from vllm_continuum.core.tool_calls.vocabulary import (
    spellings, token_texts, tokens_spelling, vocab_of,
)

logger = logging.getLogger("vllm.continuum")

NAME_TOKENS = 64  # the window a name is read in: `{"name": "<128 chars>"` in any tokenizer
MAX_SPELLED_TRIES = 8  # positions where a spelled marker may begin, tried per output
THINK_END = "</think>"  # a text-format call may follow the model's reasoning


@dataclass(frozen=True)
class ToolCall:
    name: str  # the tool, `unknown` if unreadable
    format: str  # how it was written: a family or text format, `pattern`, `token`, `forced`, `hint`


def _token_family(token: str) -> Family:
    """A configured `tool_call_tokens` entry, read as Hermes' marker was."""
    return Family("token", starts=(token,), names=(NameReader(JSON_NAME, "token"),))


class ToolCallDetector:
    def __init__(self, tokenizer, *, parser: str | None = None, tokens: Sequence[str] = (),
                 patterns: Sequence[str] = ()) -> None:
        """`parser`: the configured `tool_call_parser` (vLLM's name); `tokens`:
        more single-token markers (`tool_call_tokens`); `patterns`: text regexes."""
        self.tokenizer = tokenizer
        vocab = vocab_of(tokenizer) or {}
        self.parser = parser
        self._families = [*FAMILIES, *(_token_family(t) for t in tokens)]
        self._starts = {vocab[m]: (f, m) for f in self._families for m in f.starts if m in vocab}
        self._ends = {vocab[m]: (f, m) for f in self._families for m in f.ends if m in vocab}
        self._look_back = {f.name: [vocab[m] for m in f.look_back_to if m in vocab]
                           for f, _ in self._ends.values()}
        found = [f.name for f, _ in (*self._starts.values(), *self._ends.values())]
        self.found = list(dict.fromkeys(found))  # the families whose markers are tokens here
        self.missing_tokens = [t for t in tokens if t not in vocab]
        self._think_end = vocab.get(THINK_END)
        # Spelled markers: the tokens they may begin with, for every family (a
        # request may name its parser); scanned by default for the families
        # found and those of the configured parser and tokens.
        texts = token_texts(tokenizer, vocab) if vocab else None
        markers = {m for f in self._families for m in f.starts}
        self._spellings = spellings(texts, markers) if texts else {}
        self._by_default = [f for f in self._families if f.name in self.found
                            or f.name in (*self._families_of(parser), "token")]
        self._default_spelled = self._spelling_set(self._by_default)
        self.patterns = TextPatterns(patterns)
        chars = self.patterns.required_chars() if self.patterns else None
        self.pattern_ids = tokens_spelling(texts, chars) if chars and texts else None
        # Every token a call may be seen by: one set scan of an output finds them.
        self.watched = frozenset(self._starts) | frozenset(self._ends) | self._default_spelled
        if self.patterns and self.pattern_ids is not None:
            self.watched |= self.pattern_ids
        self._extra: dict[str, frozenset[int]] = {}

    # ------------------------------------------------------------------ reading
    def tool_called(self, output_token_ids: Sequence[int], parser: str | None = None,
                    forced: bool = False) -> ToolCall | None:
        """The call the output makes, else None. `parser`: the request's vLLM
        tool parser (else the configured one); `forced`: the request forced a
        call (`tool_choice: required`), so it is one whatever its text.
        Never raises (it runs inside vLLM's step): a failure reads as no call."""
        try:
            return self._tool_called(output_token_ids, parser, forced)
        except Exception:  # noqa: BLE001
            logger.warning("continuum: could not read a finished turn's tool call", exc_info=True)
            return None

    def _tool_called(self, output_token_ids: Sequence[int], parser: str | None,
                     forced: bool) -> ToolCall | None:
        output = output_token_ids if isinstance(output_token_ids, list) else list(output_token_ids)
        present = self.watched.intersection(output)
        parser = parser or self.parser
        call = self._by_marker(output, present) if present else None
        if call is None and parser != self.parser and parser in PARSERS:
            extra = self._extra_spelled(parser)
            if extra and not extra.isdisjoint(output):
                families = [FAMILY[f] for f in self._families_of(parser)]
                call = self._spelled(output, extra, families)
        if call is None and parser in PARSERS and PARSERS[parser].text:
            text_format = TEXT_FORMATS[PARSERS[parser].text]
            name = self._at_message_start(output, text_format.pattern)
            call = ToolCall(name, text_format.name) if name else None
        if call is None and forced:
            call = ToolCall(self._at_message_start(output, JSON_NAME) or UNKNOWN_TOOL, "forced")
        if call is None and self.patterns:
            if self.pattern_ids is None or present & self.pattern_ids:
                name = self.patterns.match(self._decode(output))
                call = ToolCall(name, "pattern") if name else None
        return call

    def _by_marker(self, output: list[int], present: set[int]) -> ToolCall | None:
        """A call the output makes by a marker token, read at the start marker
        nearest its end (calls end a turn: each marker is looked for in the
        last `TAIL` tokens first), else back from its last end token."""
        starts = [(near_end(output, i), i) for i in present if i in self._starts]
        for position, token_id in sorted(starts, reverse=True):
            family, marker = self._starts[token_id]
            if family.first_only and output[0] != token_id:
                continue
            position = 0 if family.first_only else position
            return self._read(family, marker, self._decode(output[position:position + NAME_TOKENS]))
        ends = [near_end(output, i) for i in present if i in self._ends]
        if ends:
            end = max(ends)
            family = self._ends[output[end]][0]
            back = self._look_back[family.name]
            begin = max([0, *(last_index(output, i, end) for i in back)])
            return self._read(family, None, self._decode(output[begin:min(end, begin + NAME_TOKENS)]))
        spelled = present & self._default_spelled
        return self._spelled(output, spelled, self._by_default) if spelled else None

    def _spelled(self, output: list[int], candidates: set[int],
                 families: Sequence[Family]) -> ToolCall | None:
        """A start marker of `families` written out of ordinary tokens (guided
        decoding: a forced call starts the output, an auto one ends it),
        beginning at one of the first `MAX_SPELLED_TRIES` positions of
        `candidates` in the output's first `HEAD` and last `TAIL` tokens."""
        tried = 0
        for p in positions(output, candidates):
            for family, marker in self._spelled_at(output, p, families):
                if family.first_only and p > 0:
                    continue
                tried += 1
                span = len(marker.encode()) + 1
                if marker in self._decode(output[p:p + span]):
                    return self._read(family, marker, self._decode(output[p:p + span + NAME_TOKENS]))
            if tried >= MAX_SPELLED_TRIES:
                break
        return None

    def _read(self, family: Family, marker: str | None, text: str) -> ToolCall:
        """The name in `text` (from the marker on), read after `family.name_after`."""
        if marker is not None and (at := text.find(marker)) >= 0:
            text = text[at + len(marker):]
        if family.name_after and family.name_after != marker and (at := text.find(family.name_after)) >= 0:
            text = text[at + len(family.name_after):]
        for reader in family.names:
            found = reader.pattern.search(text)
            if found and found.group(1):
                return ToolCall(found.group(1), reader.format)
        return ToolCall(UNKNOWN_TOOL, family.name)

    def _at_message_start(self, output: list[int], pattern) -> str | None:
        """Group 1 of `pattern` matched at the output's start or, after the
        model's reasoning, right after its last `</think>` token."""
        begins = [0]
        if self._think_end is not None and self._think_end in output:
            begins.append(last_index(output, self._think_end, len(output)) + 1)
        for begin in begins:
            found = pattern.match(self._decode(output[begin:begin + NAME_TOKENS]))
            if found:
                return found.group(1) or UNKNOWN_TOOL
        return None

    # ----------------------------------------------------------------- plumbing
    def marker_ids(self) -> dict[str, int]:
        """The markers found as single tokens, and their ids."""
        return {m: i for i, (_, m) in (*self._starts.items(), *self._ends.items())}

    @staticmethod
    def _families_of(parser: str | None) -> tuple[str, ...]:
        return PARSERS[parser].families if parser in PARSERS else ()

    def _extra_spelled(self, parser: str) -> frozenset[int]:
        """What a request's own parser adds to the spelled markers scanned (cached:
        parsers are a known few)."""
        if parser not in self._extra:
            families = (FAMILY[f] for f in self._families_of(parser))
            self._extra[parser] = self._spelling_set(families) - self.watched
        return self._extra[parser]

    def _spelling_set(self, families: Iterable[Family]) -> frozenset[int]:
        ids = {i for f in families for m in f.starts if m in self._spellings
               for i in self._spellings[m].firsts}
        return frozenset(ids - self._starts.keys())

    def _spelled_at(self, output: list[int], p: int, families: Sequence[Family]):
        """The markers of `families` a spelling may begin at position `p` (its
        first token, then its second token, allow it)."""
        second = output[p + 1] if p + 1 < len(output) else None
        for family in families:
            for marker in family.starts:
                spelling = self._spellings.get(marker)
                if spelling is not None and output[p] in spelling.firsts and (
                        second in spelling.seconds or output[p] in spelling.whole):
                    yield family, marker

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None or not token_ids:
            return ""
        try:
            return self.tokenizer.decode(token_ids)
        except Exception:  # noqa: BLE001  (a tokenizer quirk must never fail a request)
            logger.debug("continuum: could not decode a finished output", exc_info=True)
            return ""
