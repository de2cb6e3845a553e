"""Fixtures of the scheduler tier: a real vLLM scheduler (sync and async),
no model server, driven by `harness.Driver`."""

from __future__ import annotations

import pytest
from tests.scheduler.harness import Driver, FakeClock, audit, make_scheduler


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request) -> bool:
    return request.param


@pytest.fixture
def build(tiny_model_dir, async_scheduling, monkeypatch):
    """Build a continuum (or stock) scheduler wrapped in an auditing driver.

    The mechanism is tested under the `fixed` TTL policy (a known TTL per
    pin); tests may override any CONTINUUM_* variable before building."""
    monkeypatch.setenv("CONTINUUM_TTL_POLICY", "fixed")
    monkeypatch.setenv("CONTINUUM_MAX_SESSION_PINNED_FRACTION", "1")

    def _build(**kwargs):
        scheduler = make_scheduler(
            tiny_model_dir, async_scheduling=async_scheduling, **kwargs
        )
        if hasattr(scheduler, "continuum"):
            scheduler.continuum.clock = FakeClock()
        driver = Driver(scheduler)
        stock_step = driver.step

        def audited_step():
            out = stock_step()
            audit(scheduler)
            return out

        driver.step = audited_step
        return driver

    return _build


