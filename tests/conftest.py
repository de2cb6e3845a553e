from __future__ import annotations

import os

import pytest

# vLLM must know the device before any config is built (official vLLM is a
# CUDA build and cannot infer it on a CPU machine).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from vllm_continuum.tiny_model import build_tiny_model

    cached = os.environ.get("CONTINUUM_TINY_MODEL_DIR")
    target = cached or str(tmp_path_factory.mktemp("tiny-model"))
    return str(build_tiny_model(target))
