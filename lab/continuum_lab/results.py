"""What a run recorded, per turn and per program: the replay client and the
simulator fill the same records, so that one report serves both.

A turn's times are seconds from the run's start (`sent_s`), to its first
token (`ttft_s`) and to its end (`latency_s`); its prompt and cached tokens
say how much of the history was found in the KV cache. A program's job
completion time (JCT) is the end of its last turn minus its arrival. One-shot
requests (traffic without a session, trace_format.py) are recorded apart
(`RunResult.one_shot`), so that the agents' figures are the agents' only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TurnRecord:
    program: str
    turn: int
    tool: str | None
    sent_s: float  # from the run's start
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prev_prompt_tokens: int  # the previous turn's prompt (0 on a first turn)


@dataclass
class ProgramRecord:
    program: str
    arrival_s: float
    end_s: float
    turns: int

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s


@dataclass
class RunResult:
    label: str
    started_at: float  # wall clock (time.time()) of the start
    duration_s: float
    programs: list[ProgramRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    one_shot: list[TurnRecord] = field(default_factory=list)  # requests without a session

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "meta": self.meta,
            "errors": self.errors,
            "programs": [{**asdict(p), "jct_s": p.jct_s} for p in self.programs],
            "turns": [asdict(t) for t in self.turns],
            "one_shot": [asdict(t) for t in self.one_shot],
        }

    @classmethod
    def from_json(cls, data: dict) -> RunResult:
        return cls(
            label=data["label"],
            started_at=data["started_at"],
            duration_s=data["duration_s"],
            meta=data.get("meta", {}),
            errors=data.get("errors", []),
            programs=[
                ProgramRecord(p["program"], p["arrival_s"], p["end_s"], p["turns"])
                for p in data["programs"]
            ],
            turns=[TurnRecord(**t) for t in data["turns"]],
            one_shot=[TurnRecord(**t) for t in data.get("one_shot", [])],
        )

    def record(self, turn: TurnRecord, one_shot: bool) -> None:
        (self.one_shot if one_shot else self.turns).append(turn)

    def sort(self) -> None:
        """Programs by arrival, turns by program and turn, one-shot requests by send time."""
        self.programs.sort(key=lambda p: p.arrival_s)
        self.turns.sort(key=lambda t: (t.program, t.turn))
        self.one_shot.sort(key=lambda t: t.sent_s)
