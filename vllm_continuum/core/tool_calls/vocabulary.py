"""What a tokenizer's vocabulary says, read once at start-up.

- `vocab_token_id`: a marker's id when the tokenizer holds it as one token.
- `token_texts`: the bytes each token decodes to, where the vocabulary shows
  them: exactly for byte-level BPE (Qwen, Llama 3, GPT-2 and the like: each
  entry spells its bytes in GPT-2's printable alphabet), closely for
  SentencePiece (`▁` is a space, `<0xNN>` a byte) and for tokenizers whose
  vocabulary holds the decoded text (vLLM's Mistral Tekken). None when the
  vocabulary cannot be read.
- `spellings`: for a marker written out of ordinary tokens (guided decoding
  may spell `<tool_call>` as `<` `tool` `_call` `>`), the tokens such a
  spelling can begin with (their text ends with a prefix of the marker, or
  holds all of it), and those that can come second. An output holding no
  first token holds no spelled marker; a first token followed by no second
  begins none: only the rest is decoded, to look.
- `tokens_spelling`: the tokens whose text holds one of a few characters (the
  text patterns' prefilter).

The ASCII characters of a token's text appear as themselves in all of these
(only byte-level BPE's space and control bytes, and SentencePiece's byte
tokens, are spelled otherwise, and are mapped back here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

logger = logging.getLogger("vllm.continuum")


def vocab_of(tokenizer) -> Mapping[str, int] | None:
    """The tokenizer's vocabulary (added tokens included, by their text); None if unreadable."""
    if tokenizer is None:
        return None
    try:
        return tokenizer.get_vocab()
    except Exception:  # noqa: BLE001  (a tokenizer quirk must not break the engine)
        logger.debug("continuum: the tokenizer's vocabulary is unreadable", exc_info=True)
        return None


def vocab_token_id(tokenizer, token: str) -> int | None:
    """`token`'s id in the tokenizer's vocabulary; None if absent or unreadable."""
    vocab = vocab_of(tokenizer)
    return vocab.get(token) if vocab is not None else None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that spells each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def _decoder_kind(tokenizer) -> str:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__


def token_texts(tokenizer, vocab: Mapping[str, int] | None) -> dict[int, bytes] | None:
    """Token id -> the bytes it decodes to (see the module's docstring); None
    if the vocabulary is not one of these (nothing is then read from it)."""
    if vocab is None:
        return None
    try:
        if _decoder_kind(tokenizer) == "ByteLevel":
            return {i: _byte_level(token, _BYTE_LEVEL) for token, i in vocab.items()}
        return {i: _piece(token) for token, i in vocab.items()}
    except Exception:  # noqa: BLE001  (an unknown vocabulary: spelled markers not looked for)
        logger.debug("continuum: the tokenizer's vocabulary is not text", exc_info=True)
        return None


def _byte_level(token: str, alphabet: dict[str, int]) -> bytes:
    if isinstance(token, bytes):
        return token
    try:
        return bytes(alphabet[ch] for ch in token)
    except KeyError:  # an added token, stored as its text
        return token.encode("utf-8", "replace")


def _piece(token: str | bytes) -> bytes:
    if isinstance(token, bytes):  # a tiktoken-style vocabulary
        return token
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace("▁", " ").encode("utf-8", "replace")


@dataclass(frozen=True)
class Spelling:
    """How a marker can be spelled out of ordinary tokens: the tokens the
    spelling can begin with (their text ends with a prefix of the marker, or
    holds all of it), and those that can come second (their text is a prefix
    of what is left of the marker, or begins with all of it)."""

    firsts: frozenset[int]
    seconds: frozenset[int]
    whole: frozenset[int]  # first tokens that hold the whole marker (no second needed)


def spellings(texts: Mapping[int, bytes], markers: Iterable[str]) -> dict[str, Spelling]:
    """Marker -> its `Spelling`. One pass over the vocabulary for all markers,
    each token checked against the markers' prefixes ending in its last byte
    and their suffixes starting with its first."""
    wanted = {m: m.encode() for m in dict.fromkeys(markers)}
    by_last: dict[int, list[tuple[str, bytes]]] = {}
    by_first: dict[int, list[tuple[str, bytes]]] = {}
    for marker, raw in wanted.items():
        for cut in range(1, len(raw)):
            by_last.setdefault(raw[cut - 1], []).append((marker, raw[:cut]))
            by_first.setdefault(raw[cut], []).append((marker, raw[cut:]))
    shortest = min(map(len, wanted.values()), default=0)
    firsts: dict[str, set[int]] = {m: set() for m in wanted}
    seconds: dict[str, set[int]] = {m: set() for m in wanted}
    whole: dict[str, set[int]] = {m: set() for m in wanted}
    for token_id, text in texts.items():
        if not text:
            continue
        for marker, prefix in by_last.get(text[-1], ()):
            if text.endswith(prefix):
                firsts[marker].add(token_id)
        for marker, rest in by_first.get(text[0], ()):
            if rest.startswith(text) or text.startswith(rest):
                seconds[marker].add(token_id)
        if len(text) > shortest:  # holds a whole marker and more
            for marker, raw in wanted.items():
                if raw in text:
                    whole[marker].add(token_id)
    return {m: Spelling(frozenset(firsts[m] | whole[m]), frozenset(seconds[m]), frozenset(whole[m]))
            for m in wanted}


def tokens_spelling(texts: Mapping[int, bytes], chars: frozenset[str]) -> frozenset[int]:
    """Ids of the tokens whose text holds one of `chars` (printable ASCII,
    which every kind of vocabulary above spells as itself): an output none of
    whose tokens is one cannot hold such a character once decoded."""
    wanted = tuple(c.encode() for c in chars)
    return frozenset(i for i, text in texts.items() if any(c in text for c in wanted))
