"""The general plugin and the version gate."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from vllm.config.scheduler import SchedulerConfig

from vllm_continuum.adapter.compat import UnsupportedVLLMError, check_vllm_version
from vllm_continuum.adapter.plugin import register
from vllm_continuum.adapter.scheduler import ContinuumAsyncScheduler, ContinuumScheduler


def config(scheduler_cls, async_scheduling):
    return SchedulerConfig(
        scheduler_cls=scheduler_cls,
        async_scheduling=async_scheduling,
        max_model_len=1024,
        is_encoder_decoder=False,
    )


def test_entry_point_is_declared():
    plugins = entry_points(group="vllm.general_plugins")
    assert any(ep.name == "continuum" and ep.value == "vllm_continuum.adapter.plugin:register" for ep in plugins)


@pytest.fixture(autouse=True)
def _own_metrics_dir(tmp_path, monkeypatch):
    """register() exports CONTINUUM_METRICS_DIR for the engine core: keep it to this test."""
    monkeypatch.setenv("CONTINUUM_METRICS_DIR", str(tmp_path / "metrics"))


def test_register_is_idempotent_and_resolves_the_short_name():
    register()
    wrapped = SchedulerConfig.get_scheduler_cls
    register()
    assert SchedulerConfig.get_scheduler_cls is wrapped
    resolved_async = config("continuum", True).get_scheduler_cls()
    resolved_sync = config("continuum", False).get_scheduler_cls()
    assert issubclass(resolved_async, ContinuumAsyncScheduler)
    assert issubclass(resolved_sync, ContinuumScheduler)
    assert not issubclass(resolved_sync, ContinuumAsyncScheduler)
    # One class per variant.
    assert config("continuum", False).get_scheduler_cls() is resolved_sync


def test_other_names_keep_working():
    register()
    qualified = "vllm_continuum.adapter.scheduler.ContinuumScheduler"
    assert config(qualified, False).get_scheduler_cls() is ContinuumScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert config(None, True).get_scheduler_cls() is AsyncScheduler
    assert config(None, False).get_scheduler_cls() is Scheduler


def test_the_running_vllm_is_verified():
    import vllm

    assert check_vllm_version() == vllm.__version__


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "dev"])
def test_unverified_release_is_refused_with_a_way_out(version, monkeypatch):
    monkeypatch.delenv("CONTINUUM_ALLOW_UNVERIFIED_VLLM", raising=False)
    with pytest.raises(UnsupportedVLLMError, match="CONTINUUM_ALLOW_UNVERIFIED_VLLM=1"):
        check_vllm_version(version)
    monkeypatch.setenv("CONTINUUM_ALLOW_UNVERIFIED_VLLM", "1")
    assert check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.33.0", "0.33.2rc1"])
def test_verified_releases(version):
    assert check_vllm_version(version) == version
