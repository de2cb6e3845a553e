"""`--publish NAME`: the report of a measuring command, written to docs/results/NAME.md
under the command line that reproduces it (continuum_lab/publish.py)."""

from __future__ import annotations

import pytest

from vllm_continuum.cli import main
from continuum_lab.live import cli as live_cli
from continuum_lab.publish import RESULTS_DIR, git_commit, publish_report
from continuum_lab.report import markdown_table, summarize
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.sim import cli as sim_cli


def _run(label: str, jct: float, cached: int) -> RunResult:
    run = RunResult(label=label, started_at=0.0, duration_s=jct)
    run.programs.append(ProgramRecord("p", 0.0, jct, 2))
    run.turns += [TurnRecord("p", 0, "grep", 0.0, 0.1, 1.0, 100, 0, 10, 0),
                  TurnRecord("p", 1, None, 2.0, 0.2, 1.0, 150, cached, 5, 100)]
    return run


def test_published_file_holds_the_table_and_the_command_that_reproduces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = markdown_table([summarize(_run("stock", 10.0, 32)), summarize(_run("continuum", 5.0, 110))],
                           baseline="stock")
    command = "vllm-continuum sim --workload cpu-agent --publish tiny"
    path = publish_report("tiny", table + "\nreproduce: " + command, command)
    assert path == RESULTS_DIR / "tiny.md" and path.is_file()
    text = path.read_text()
    assert text.startswith("# tiny\n")
    assert f"\n\n{table}\n" in text and "| continuum | 1 |" in text and "2.00x" in text
    assert f"Written by `{command}`" in text
    assert git_commit().split(" ")[0] in text  # the commit, when run from a checkout
    # A rerun overwrites the file: it is the latest run's report, not a log.
    publish_report("tiny", "| run |\n|---|\n| again |", command)
    assert "| again |" in path.read_text() and table not in path.read_text()


@pytest.mark.parametrize("command, module, handler", [
    ("bench", live_cli, "_bench"), ("compare", live_cli, "_compare"),
    ("sim", sim_cli, "_sim"), ("overhead", sim_cli, "_overhead"),
])
def test_every_measuring_command_takes_publish(monkeypatch, command, module, handler):
    seen = []

    def run(args):
        seen.append(args.publish)
        return 0

    monkeypatch.setattr(module, handler, run)
    assert main([command, "--publish", "my-run"]) == 0
    assert main([command]) == 0
    assert seen == ["my-run", None]
    with pytest.raises(SystemExit):  # a name, not a path: the file goes into docs/results/
        main([command, "--publish", "../elsewhere"])
