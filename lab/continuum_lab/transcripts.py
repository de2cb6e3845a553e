"""Convert recorded agent runs into a trace (trace_format.py).

Input layout: chat transcripts, one agent run per JSON file (or one per line
of a JSONL file), as OpenAI-style messages. Accepted shapes:

- mini-swe-agent trajectories (`*.traj.json`): `{"messages": [...], "info": {...}}`;
- a bare list of messages `[{"role": ..., "content": ...}, ...]`;
- `{"messages": [...]}` or `{"conversation": [...]}` from other tools.

Each assistant message is one LLM turn. Its `new_tokens` are the messages
since the previous assistant message (system prompt and task before the
first; tool results or observations after), its `output_tokens` the
assistant message itself. The tool it calls is the name of its first
`tool_calls` entry, else the first word of its first fenced shell block
(how mini-swe-agent acts, and how the paper names shell tools), else
`unknown`. The last assistant message calls no tool.

Token counts come from a Hugging Face tokenizer when one is given, else
about 4 characters per token. Tool durations come from timestamps when the
messages carry them (`timestamp` / `created_at`, seconds or ISO-8601: the
next message's time minus the assistant message's), else they are drawn,
seeded, from a workload spec's profile of the tool with that name (or its
mixture of tools for an unknown name), and the trace's header says so.
Programs arrive as a Poisson process at the given rate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

import numpy as np

from continuum_lab.trace_format import Program, Trace, Turn
from continuum_lab.workload_spec import WorkloadSpec, load_spec

_SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)?\s*\n\s*([\w./-]+)")


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content)


def _message_text(m: dict) -> str:
    text = _text(m.get("content"))
    for call in m.get("tool_calls") or []:
        fn = call.get("function", call)
        text += json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")})
    return text


def _tool_of(m: dict) -> str:
    calls = m.get("tool_calls") or []
    if calls:
        fn = calls[0].get("function", calls[0])
        if fn.get("name"):
            return str(fn["name"])
    match = _SHELL_BLOCK.search(_text(m.get("content")))
    return match.group(1).split("/")[-1] if match else "unknown"


def _time_of(m: dict) -> float | None:
    value = m.get("timestamp", m.get("created_at"))
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _messages(data) -> list[dict]:
    if isinstance(data, list):
        return data
    for key in ("messages", "conversation", "history", "trajectory"):
        value = data.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict) and "role" in value[0]:
            return value
    raise ValueError("no list of chat messages (role/content) found")


def load_transcripts(paths: Iterable[Path]) -> list[tuple[str, list[dict]]]:
    out = []
    for path in paths:
        path = Path(path)
        files = sorted(path.rglob("*.json*")) if path.is_dir() else [path]
        for f in files:
            if f.suffix == ".jsonl":
                for i, line in enumerate(f.read_text().splitlines()):
                    if line.strip():
                        out.append((f"{f.stem}-{i}", _messages(json.loads(line))))
            else:
                out.append((f.name.split(".")[0], _messages(json.loads(f.read_text()))))
    return out


def transcript_to_turns(
    messages: list[dict],
    count: Callable[[str], int],
    duration: Callable[[str, int], float],
) -> tuple[list[Turn], bool]:
    """Turns of one run; the flag says whether every duration was measured."""
    turns: list[Turn] = []
    pending = 0
    measured = True
    assistant_idx = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            pending += count(_message_text(m))
            continue
        is_last = i == assistant_idx[-1]
        tool, tool_s = None, 0.0
        if not is_last:
            tool = _tool_of(m)
            start, end = _time_of(m), _time_of(messages[i + 1]) if i + 1 < len(messages) else None
            if start is not None and end is not None and end >= start:
                tool_s = end - start
            else:
                tool_s = duration(tool, len(turns))
                measured = False
        turns.append(Turn(pending, max(1, count(_message_text(m))), tool, tool_s))
        pending = 0
    return turns, measured


def convert(
    paths: Iterable[Path],
    out: Path,
    *,
    rate: float = 0.1,
    seed: int = 0,
    tokenizer: str | None = None,
    durations_from: str | WorkloadSpec = "swebench",
) -> Trace:
    if tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)

        def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False))
    else:

        def count(text: str) -> int:
            return (len(text) + 3) // 4

    spec = durations_from if isinstance(durations_from, WorkloadSpec) else load_spec(durations_from)
    profiles = {t.name: t for t in spec.tools}
    weights = np.array([t.weight for t in spec.tools], dtype=float)
    rng = np.random.default_rng([seed, 2])
    transcripts = load_transcripts(paths)
    gaps = rng.exponential(1.0 / rate, len(transcripts))
    if len(gaps):
        gaps[0] = 0.0
    arrivals = np.cumsum(gaps)

    def duration(tool: str, _k: int) -> float:
        profile = profiles.get(tool) or spec.tools[int(rng.choice(len(spec.tools), p=weights / weights.sum()))]
        return float(profile.duration_s.sample(rng))

    programs, all_measured = [], True
    for (name, messages), arrival in zip(transcripts, arrivals):
        turns, measured = transcript_to_turns(messages, count, duration)
        all_measured &= measured
        if turns:
            programs.append(Program(name, float(arrival), tuple(turns)))
    trace = Trace(programs, {
        "source": [str(p) for p in paths],
        "converter": "continuum_lab.transcripts (chat transcripts)",
        "token_counts": tokenizer or "chars/4",
        "tool_durations": "timestamps" if all_measured else f"drawn from workload {spec.name}",
        "arrival_rate": rate,
        "seed": seed,
    })
    trace.save(out)
    return trace
