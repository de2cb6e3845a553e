"""The workload specs and cost models the experiment commands ship with.

They live inside the package (declared as package data in pyproject.toml),
so that `--workload swebench` or `--cost-model h100-llama3.1-8b` finds its
file in an installed wheel as in a checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
WORKLOAD_DIR = CONFIG_DIR / "workloads"
COST_MODEL_DIR = CONFIG_DIR / "cost_models"


def named_yaml(name_or_path: str | os.PathLike, directory: Path, what: str) -> Path:
    """A YAML file by path, or by name from one of the shipped folders
    (`swebench` -> directory/swebench.yaml); the error lists the known names."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = directory / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml") if not p.stem.endswith(".profile"))
        raise FileNotFoundError(f"no {what} {str(name_or_path)!r}; known: {known}")
    return candidate
