"""`--publish NAME`: a command's report, as it printed it, into docs/results/NAME.md.

Measured tables belong in the repository beside the method that explains them
(docs/benchmarks.md links each), but pasted by hand they drift from the code
and lose the command that made them. So every command that measures (`sim`,
its cluster runs included, `overhead`, `compare`, `bench`) writes its report
through this one function, headed by the exact command line (which carries
`--publish NAME`, so rerunning it rewrites the file), the date and the commit
of the code that ran. The path is relative to the current directory: run from
the repository root.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

RESULTS_DIR = Path("docs/results")


def result_name(value: str) -> str:
    """argparse type: a plain file name without `.md` (the file goes into docs/results/)."""
    if not value or Path(value).name != value or value.endswith(".md"):
        raise argparse.ArgumentTypeError(f"{value!r}: a name such as sim-swe-100, without '/' or '.md'")
    return value


def git_commit() -> str:
    """The checked-out commit of this package's code, marked when the tree has changes; '' outside git."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit + (" (with uncommitted changes)" if dirty else "")


def utc_date(seconds: float | None = None) -> str:
    """A time (default: now) as every report and provenance record states it."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def publish_report(name: str, report: str, command: str, results_dir: Path = RESULTS_DIR) -> Path:
    """Write `report` to results_dir/NAME.md (overwriting it) under a header naming the command."""
    commit = git_commit()
    header = [
        f"# {name}",
        "",
        f"Written by `{command}`",
        f"on {utc_date()}"
        + (f" at commit {commit}" if commit else "") + ".",
        "Run that command again from the repository root to regenerate this file;",
        "the method behind it is in [docs/benchmarks.md](../benchmarks.md).",
        "",
        "",
    ]
    path = Path(results_dir) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + report.rstrip("\n") + "\n")
    print(f"published: {path}")
    return path


def emit_report(lines: list[str], out_dir: Path, publish: str | None, command: str) -> str:
    """A command's report: written to out_dir/report.md, printed, and published
    to docs/results/ when asked (`--publish`)."""
    report = "\n".join(lines)
    (Path(out_dir) / "report.md").write_text(report + "\n")
    print(report)
    if publish:
        publish_report(publish, report, command)
    return report
