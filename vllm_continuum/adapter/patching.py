"""Replacing one of vLLM's functions, once per process.

vLLM loads general plugins several times per process (in the front end, the
engine core, each API server), so every patch must notice that it is already
in place. `patch_once` marks the wrapper it installs and skips a marked one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MARK = "_vllm_continuum_wrapped"


def patch_once(
    owner: Any, name: str, wrap: Callable[[Callable], Callable]
) -> tuple[Callable, Callable] | None:
    """Set `owner.name` to `wrap(stock)`; return (stock, wrapper), or None if
    our wrapper is already there."""
    stock = getattr(owner, name)
    if getattr(stock, _MARK, False):
        return None
    wrapper = wrap(stock)
    setattr(wrapper, _MARK, True)
    wrapper.__doc__ = stock.__doc__
    setattr(owner, name, wrapper)
    return stock, wrapper
