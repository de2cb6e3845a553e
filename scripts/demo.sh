#!/usr/bin/env bash
# The demo from nothing: install (CPU build only), build the tiny model, start
# stock vLLM and continuum side by side, run the tool-call pause on both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-vllm033
exec .venv/bin/vllm-continuum demo "$@"
