"""`compare`'s rounds on disk: each replay with the trace it actually sent.

Each replay of a round is `rounds/rN-FLAVOUR/` in a compare run's directory:
its records (`results.json`; for a continuum server, its settings and its
effective config in the run's meta) and the trace it sent
(`sent-trace.jsonl`, sent_trace.py), which `vllm-continuum predict` replays
in the simulator. Kept apart per replay, not merged per flavour, because the
machine's speed drifts between replays: a flavour is only ever set against
stock's run of the same round (round_report.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from continuum_lab.live.sent_trace import sent_trace
from continuum_lab.report import write_runs
from continuum_lab.results import RunResult
from continuum_lab.trace_format import Trace

ROUNDS_DIR = "rounds"
SENT_TRACE = "sent-trace.jsonl"


@dataclass
class RoundRecord:
    round: int
    run: RunResult
    sent: Trace

    @property
    def label(self) -> str:
        return self.run.label


def save_round(run: RunResult, planned: Trace, out_dir: Path) -> Path:
    """One replay of a round (run.meta["round"] set), and the trace it sent."""
    where = Path(out_dir) / ROUNDS_DIR / f"r{run.meta['round']}-{run.label}"
    write_runs([run], where)
    sent_trace(run, planned).save(where / SENT_TRACE)
    return where


def _load_round(where: Path) -> RoundRecord:
    results, sent = where / "results.json", where / SENT_TRACE
    if not (results.is_file() and sent.is_file()):
        raise FileNotFoundError(f"{where} lacks {results.name} or {sent.name} (a replay interrupted "
                                "while it was saved?): remove that directory, or run compare again")
    run = RunResult.from_json(json.loads(results.read_text())["runs"][0])
    return RoundRecord(int(run.meta["round"]), run, Trace.load(sent))


def load_rounds(out_dir: Path) -> list[RoundRecord]:
    """Every recorded replay of a `compare` run, by round then in the order they ran."""
    base = Path(out_dir) / ROUNDS_DIR
    if not base.is_dir():
        raise FileNotFoundError(
            f"{out_dir} has no {ROUNDS_DIR}/: not a `compare` output directory, or one written "
            "before compare recorded its rounds; run compare again")
    records = [_load_round(where) for where in base.iterdir() if where.is_dir()]
    return sorted(records, key=lambda r: (r.round, r.run.started_at, r.label))
