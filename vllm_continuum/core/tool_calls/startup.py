"""The start-up log line: which tool-call formats the scheduler will see, and
when it sees none, the setting it needs."""

from __future__ import annotations

import logging

from vllm_continuum.core.tool_calls.families import FAMILIES, FAMILY, PARSERS, TEXT_FORMATS

MIDDLEWARE = "vllm_continuum.frontend.middleware.ClientSessionMiddleware"
_ALWAYS = ('forced calls (tool_choice "required" by vLLM\'s JSON schema; any forced call '
           f"through --middleware {MIDDLEWARE}) and the continuum_tool hint")


def _formats(family: str) -> list[str]:
    """The formats a family's markers are read in (several share `<tool_call>`)."""
    found = FAMILY.get(family)
    return list(dict.fromkeys([family, *(r.format for r in found.names)])) if found else [family]


def describe(detector) -> tuple[int, str]:
    """(log level, message) for the detector built from the served tokenizer."""
    if detector.tokenizer is None:
        return logging.WARNING, (
            "continuum: no tokenizer in the engine core (skip_tokenizer_init?): a turn is "
            f"recognised as a tool call only by {_ALWAYS}.")
    parts, level = [], logging.INFO
    if detector.found:
        markers = ", ".join(f"{m}={i}" for m, i in detector.marker_ids().items())
        formats = " and ".join("/".join(_formats(name)) for name in detector.found)
        parts.append(f"markers of {formats} in the vocabulary ({markers})")
    if detector.parser is not None:
        parser = PARSERS[detector.parser]
        read = ([f"{TEXT_FORMATS[parser.text].name} text at a message's start"] if parser.text else [])
        if parser.families:
            read.append("its markers also where the output spells them out of ordinary tokens")
        parts.append(f"tool_call_parser {detector.parser}: {', '.join(read)}")
    if detector.missing_tokens:
        level = logging.WARNING
        parts.append(f"tool_call_tokens {detector.missing_tokens} are not single tokens of this "
                     "tokenizer: recognised only where the output spells them")
    if detector.patterns:
        parts.append(f"{len(detector.patterns)} text pattern(s)")
    message = "continuum: tool calls: " + "; ".join(parts) + f"; also {_ALWAYS}."
    if detector.found or detector.parser is not None:
        return level, message
    families = ", ".join(f.name for f in FAMILIES)
    return logging.WARNING, (
        f"continuum: no tool-call marker of a known format is a single token of this tokenizer "
        f"(looked up: {families}): a turn is recognised as a tool call only by "
        + (f"{len(detector.patterns)} text pattern(s), " if detector.patterns else "")
        + f"{_ALWAYS}. If the model writes its calls as text, set tool_call_parser to vLLM's "
        f"--tool-call-parser name ({', '.join(sorted(PARSERS))}), or load --middleware "
        f"{MIDDLEWARE}, which passes the server's own; if it has a tool-call token of its own, "
        "set tool_call_tokens.")
