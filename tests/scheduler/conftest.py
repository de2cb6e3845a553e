"""Fixtures of the scheduler tier: a real vLLM scheduler (sync and async),
no model server, driven by `harness.Driver`."""

from __future__ import annotations

import pytest
from tests.scheduler.harness import Driver, FakeClock, audit, make_scheduler


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request) -> bool:
    return request.param


# The mechanism is tested under the `fixed` TTL policy (a known TTL per pin),
# one session's pins bounded by the pool only.
MECHANISM = {"ttl_policy": "fixed", "max_session_pinned_fraction": 1.0}


@pytest.fixture
def build(tiny_model_dir, async_scheduling):
    """Build a continuum (or stock) scheduler wrapped in an auditing driver.
    `settings` (ContinuumConfig fields) go over MECHANISM into the one config
    the scheduler is given."""

    def _build(settings: dict | None = None, **kwargs):
        scheduler = make_scheduler(
            tiny_model_dir, async_scheduling=async_scheduling,
            settings={**MECHANISM, **(settings or {})}, **kwargs
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


