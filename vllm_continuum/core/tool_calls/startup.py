"""The start-up log line: which tool-call formats the scheduler will see, and
when it sees none, the setting it needs."""

from __future__ import annotations

import logging

from vllm_continuum.core.tool_calls.families import FAMILIES, PARSERS, TEXT_FORMATS

MIDDLEWARE = "vllm_continuum.frontend.middleware.ClientSessionMiddleware"
_ALWAYS = ('forced calls (tool_choice "required" by vLLM\'s JSON schema; any forced call '
           f"through --middleware {MIDDLEWARE}) and the continuum_tool hint")


def describe(detector) -> tuple[int, str]:
    """(log level, message) for the detector built from the served tokenizer."""
    if detector.tokenizer is None:
        return logging.WARNING, (
            "continuum: no tokenizer in the engine core (skip_tokenizer_init?): a turn is "
            f"recognised as a tool call only by {_ALWAYS}.")
    parts, level = [], logging.INFO
    if detector.found:
        markers = ", ".join(f"{m}={i}" for m, i in detector.marker_ids().items())
        parts.append(f"{' and '.join(detector.found)} markers in the vocabulary ({markers})")
    if detector.parser is not None:
        text = PARSERS[detector.parser].text
        parts.append(f"tool_call_parser {detector.parser}: "
                     + (f"{TEXT_FORMATS[text].name} text at a message's start, " if text else "")
                     + "its markers also where the output spells them out of ordinary tokens")
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
