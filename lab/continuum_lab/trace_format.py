"""The trace format: agent programs as JSON Lines, one program per line.

A trace says what an agent workload asks of an LLM server, at token level,
so that it can be replayed against a real server (`vllm-continuum bench`) or
a simulated one (`vllm-continuum sim`), whether it was generated from a
workload spec (`workload_spec.py`) or converted from recorded agent runs.

Format `vllm-continuum-trace/1`::

    {"format": "vllm-continuum-trace/1", "workload": "swebench-like", ...}   optional header
    {"id": "p0000", "arrival_s": 0.0, "turns": [
        {"new_tokens": 2210, "output_tokens": 143, "tool": "grep", "tool_s": 0.21},
        {"new_tokens": 380,  "output_tokens": 97,  "tool": "python", "tool_s": 1.73},
        {"new_tokens": 512,  "output_tokens": 90,  "tool": null, "tool_s": 0.0}]}

- `arrival_s`: when the program's first turn is sent, seconds from the start
  of the run (Poisson arrivals for generated traces).
- A turn's prompt is the whole history: everything the previous turns sent
  and generated, then its `new_tokens` (the system prompt and task for the
  first turn; the tool's result, as the agent appends it, afterwards). So
  prompt(k) = sum(new_tokens[0..k]) + sum(output_tokens[0..k-1]).
- `output_tokens`: tokens the turn generates (replayed with `max_tokens`
  and `ignore_eos`, so the length is the trace's whatever the model).
- `tool` / `tool_s`: the tool this turn calls and how long it runs: the
  pause between the end of this turn and the arrival of the next. The last
  turn of a program calls no tool (`null`, 0).

A one-shot request (chat traffic beside the agents) is a program of one
turn that calls no tool, flagged `"one_shot": true`::

    {"id": "c0007", "arrival_s": 3.2, "one_shot": true, "turns": [
        {"new_tokens": 900, "output_tokens": 210, "tool": null, "tool_s": 0.0}]}

It is sent without a session id or continuum hints (nothing to pin, no
program to order it with), and reported apart from the agents: a program's
figures (JCT, reuse) are the agents' only. Programs without the flag are
written without the key, so agent-only traces are unchanged.

A header line (any line with a `format` key) is optional; its other keys
are kept as metadata. Unknown keys in program lines are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_continuum.core.hints import LAST_TURN_KEY, TOOL_KEY

FORMAT = "vllm-continuum-trace/1"


@dataclass(frozen=True)
class Turn:
    new_tokens: int
    output_tokens: int
    tool: str | None = None
    tool_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "output_tokens": self.output_tokens,
            "tool": self.tool,
            "tool_s": round(self.tool_s, 6),
        }


@dataclass(frozen=True)
class Program:
    id: str
    arrival_s: float
    turns: tuple[Turn, ...]
    one_shot: bool = False  # a request without a session (see the module docstring)
    session: bool = False  # a one-shot that carries a session id: a one-turn program

    def __post_init__(self) -> None:
        if self.one_shot and (len(self.turns) != 1 or self.turns[0].tool is not None):
            raise ValueError(f"{self.id}: a one-shot request is one turn that calls no tool")

    def prompt_tokens(self, k: int) -> int:
        """Prompt length of turn k (0-based): the whole history, then its new tokens."""
        return sum(t.new_tokens for t in self.turns[: k + 1]) + sum(
            t.output_tokens for t in self.turns[:k]
        )

    @property
    def prompt_lengths(self) -> list[int]:
        out, total = [], 0
        for turn in self.turns:
            total += turn.new_tokens
            out.append(total)
            total += turn.output_tokens
        return out

    @property
    def total_prompt_tokens(self) -> int:
        """Sum of every turn's prompt: what a server without prefix caching prefills."""
        return sum(self.prompt_lengths)

    @property
    def final_context_tokens(self) -> int:
        return self.prompt_lengths[-1] + self.turns[-1].output_tokens

    @property
    def tool_durations(self) -> list[float]:
        return [t.tool_s for t in self.turns if t.tool is not None]

    def to_json(self) -> dict:
        flag = {"one_shot": True} if self.one_shot else {}
        if self.session:
            flag["session"] = True
        return {
            "id": self.id,
            "arrival_s": round(self.arrival_s, 6),
            **flag,
            "turns": [t.to_json() for t in self.turns],
        }


@dataclass
class Trace:
    programs: list[Program]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self.programs)

    @property
    def agents(self) -> list[Program]:
        return [p for p in self.programs if not p.one_shot]

    @property
    def one_shots(self) -> list[Program]:
        return [p for p in self.programs if p.one_shot]

    def head(self, n: int) -> Trace:
        """The first n agent programs and the one-shot requests that arrive while
        they do: what a spec generates for n programs (workload_spec.py)."""
        agents = {p.id for p in self.agents[:n]}
        until = max((p.arrival_s for p in self.programs if p.id in agents), default=0.0)
        kept = [p for p in self.programs if p.id in agents or (p.one_shot and p.arrival_s <= until)]
        return Trace(kept, dict(self.meta))

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            f.write(json.dumps({"format": FORMAT, **self.meta}) + "\n")
            for program in self.programs:
                f.write(json.dumps(program.to_json()) + "\n")
        return path

    @classmethod
    def load(cls, path: Path | str) -> Trace:
        return cls.parse(Path(path).read_text().splitlines(), source=str(path))

    @classmethod
    def parse(cls, lines: Iterable[str], source: str = "<trace>") -> Trace:
        meta: dict = {}
        programs: list[Program] = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if "format" in data:
                    if data["format"] != FORMAT:
                        raise ValueError(f"unsupported format {data['format']!r} (want {FORMAT})")
                    meta = {k: v for k, v in data.items() if k != "format"}
                    continue
                programs.append(program_from_json(data))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{source}:{lineno}: not a trace line: {exc}") from exc
        programs.sort(key=lambda p: (p.arrival_s, p.id))
        return cls(programs, meta)

    def summary(self) -> dict:
        """Per-program statistics of the agents, as Table 2 of the paper reports
        them, and (when the trace has any) of the one-shot requests."""
        import numpy as np

        agents = self.agents
        turns = np.array([len(p.turns) for p in agents], dtype=float)
        tokens = np.array([p.total_prompt_tokens for p in agents], dtype=float)
        final = np.array([p.final_context_tokens for p in agents], dtype=float)
        tools = np.array([d for p in agents for d in p.tool_durations], dtype=float)
        outputs = np.array([t.output_tokens for p in agents for t in p.turns], dtype=float)
        return {
            "programs": len(agents),
            "turns_mean": float(turns.mean()) if turns.size else 0.0,
            "turns_std": float(turns.std()) if turns.size else 0.0,
            "tool_s_mean": float(tools.mean()) if tools.size else 0.0,
            "tool_s_std": float(tools.std()) if tools.size else 0.0,
            "tool_s_p50": float(np.percentile(tools, 50)) if tools.size else 0.0,
            "tool_s_p99": float(np.percentile(tools, 99)) if tools.size else 0.0,
            "tokens_mean": float(tokens.mean()) if tokens.size else 0.0,
            "tokens_std": float(tokens.std()) if tokens.size else 0.0,
            "final_context_mean": float(final.mean()) if final.size else 0.0,
            "final_context_max": int(final.max()) if final.size else 0,
            "output_tokens_mean": float(outputs.mean()) if outputs.size else 0.0,
            "arrival_rate": _rate(agents),
            **_one_shot_summary(self.one_shots),
        }


def _rate(programs: list[Program]) -> float:
    """Arrivals per second between the first arrival and the last."""
    span = programs[-1].arrival_s - programs[0].arrival_s if programs else 0.0
    return (len(programs) - 1) / span if span > 0 else 0.0


def _one_shot_summary(requests: list[Program]) -> dict:
    """Nothing for an agent-only trace, so that its summary is as it was."""
    if not requests:
        return {}
    import numpy as np

    prompts = np.array([p.turns[0].new_tokens for p in requests], dtype=float)
    outputs = np.array([p.turns[0].output_tokens for p in requests], dtype=float)
    return {
        "one_shot_requests": len(requests),
        "one_shot_rate": _rate(requests),
        "one_shot_prompt_mean": float(prompts.mean()),
        "one_shot_prompt_std": float(prompts.std()),
        "one_shot_output_mean": float(outputs.mean()),
        "one_shot_output_std": float(outputs.std()),
    }


def continuum_hints(turn: Turn) -> dict:
    """An agent turn's hints, as its request carries them (`vllm_xargs`): the
    tool it calls, or that it ends the program."""
    return {TOOL_KEY: turn.tool} if turn.tool else {LAST_TURN_KEY: 1}


def program_from_json(data: dict) -> Program:
    turns = []
    for t in data["turns"]:
        tool = t.get("tool")
        turn = Turn(
            new_tokens=int(t["new_tokens"]),
            output_tokens=int(t["output_tokens"]),
            tool=None if tool is None else str(tool),
            tool_s=float(t.get("tool_s", 0.0) or 0.0),
        )
        if turn.new_tokens < 0 or turn.output_tokens < 1 or turn.tool_s < 0:
            raise ValueError(f"negative or empty counts in turn {t}")
        turns.append(turn)
    if not turns:
        raise ValueError("a program needs at least one turn")
    return Program(id=str(data["id"]), arrival_s=float(data["arrival_s"]), turns=tuple(turns),
                   one_shot=bool(data.get("one_shot", False)), session=bool(data.get("session", False)))
