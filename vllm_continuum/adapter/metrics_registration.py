"""Wiring the exporter into vLLM, from the general plugin.

`install()` runs in every vLLM process the plugin is loaded in (API server,
API-server workers, engine cores, model workers), possibly several times:

1. The snapshot directory. The first process to get here (the one started
   by the user: it loads plugins while parsing arguments, before it spawns
   the engine core and any API-server workers) creates it and exports its
   path as `CONTINUUM_METRICS_DIR`; every later process inherits the
   variable. The creator removes it at exit. A directory named by the user
   is used as is.
2. The collector. With one API server, vLLM serves `/metrics` from
   `vllm.v1.metrics.prometheus.get_prometheus_registry()`, i.e. the global
   `REGISTRY`: that function is wrapped to add our collector to the registry
   it returns (modules that imported it by name before the plugin ran are
   pointed at the wrapper too). With `--api-server-count > 1`
   (`PROMETHEUS_MULTIPROC_DIR` set), the `/metrics` route that answers is
   prometheus-fastapi-instrumentator's, which ignores that registry and
   builds a fresh `CollectorRegistry` + `MultiProcessCollector` for every
   scrape; so `MultiProcessCollector.__init__` is wrapped as well, to add
   our collector to the registry it joins. Each API-server worker computes
   the same figures from the same snapshot files, so whichever answers, the
   scrape is the same. Processes that never serve `/metrics` never call
   either, so nothing happens there.
3. The `model_name` label. vLLM labels its metrics with the served model
   name from the `VllmConfig`; the front end builds that config with
   `EngineArgs.create_engine_config`, wrapped to remember the name.

Nothing here may break vLLM: every step is guarded and only logs.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile

from vllm_continuum.adapter.patching import patch_once
from vllm_continuum.metrics.snapshot import ENV_DIR

logger = logging.getLogger("vllm.continuum.metrics")
_state: dict = {"model_name": None, "created_dir": None}


def install() -> None:
    for step in (ensure_metrics_dir, _wrap_registry, _wrap_multiprocess_collector,
                 _wrap_engine_config):
        try:
            step()
        except Exception as exc:  # never break vLLM for a metric
            # One line, no traceback: a traceback in a server log reads as a crash.
            logger.warning("continuum metrics: %s failed (%r); continuum_* metrics "
                           "may be missing", step.__name__, exc)
            logger.debug("continuum metrics: %s", step.__name__, exc_info=True)


def ensure_metrics_dir() -> str:
    """The snapshot directory, created (and exported) by the first process."""
    current = os.environ.get(ENV_DIR)
    if current:
        os.makedirs(current, exist_ok=True)
        return current
    path = tempfile.mkdtemp(prefix="vllm-continuum-metrics-")
    os.environ[ENV_DIR] = path
    _state["created_dir"] = path
    atexit.register(_remove_dir, path, os.getpid())
    return path


def _remove_dir(path: str, creator_pid: int) -> None:
    if os.getpid() == creator_pid:  # not in a forked child
        shutil.rmtree(path, ignore_errors=True)


def model_name() -> str:
    return _state["model_name"] or "unknown"


def collector():
    """This process's collector (one: every registry gets the same object)."""
    if "collector" not in _state:
        from vllm_continuum.metrics.collector import ContinuumCollector

        _state["collector"] = ContinuumCollector(model_name)
    return _state["collector"]


def attach(registry) -> None:
    """Add the collector to `registry` unless it is already there."""
    c = collector()
    if getattr(registry, "_collector_to_names", {}).get(c) is not None:
        return
    try:
        registry.register(c)
    except ValueError:  # already registered (raced): fine
        pass


def _wrap_registry() -> None:
    from vllm.v1.metrics import prometheus

    def wrap(stock):
        def get_prometheus_registry():
            registry = stock()
            _attach_or_warn(registry)
            return registry

        return get_prometheus_registry

    patched = patch_once(prometheus, "get_prometheus_registry", wrap)
    if patched is None:
        return
    stock, wrapper = patched
    # `from ... import get_prometheus_registry` done before we got here. Only
    # vLLM's modules, read through __dict__: a module-level __getattr__ (lazy
    # packages such as transformers) must not be triggered.
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(module, "__dict__", {}).get(
            "get_prometheus_registry"
        ) is stock:
            module.get_prometheus_registry = wrapper


def _wrap_multiprocess_collector() -> None:
    from prometheus_client import multiprocess

    def wrap(stock):
        def __init__(self, registry, *args, **kwargs):
            stock(self, registry, *args, **kwargs)
            if registry is not None:
                _attach_or_warn(registry)

        return __init__

    patch_once(multiprocess.MultiProcessCollector, "__init__", wrap)


def _attach_or_warn(registry) -> None:
    try:
        attach(registry)
    except Exception as exc:  # noqa: BLE001  (never break vLLM for a metric)
        logger.warning("continuum metrics: could not attach the collector (%r)", exc)


def _wrap_engine_config() -> None:
    from vllm.engine.arg_utils import EngineArgs

    def wrap(stock):
        def create_engine_config(self, *args, **kwargs):
            config = stock(self, *args, **kwargs)
            try:
                _state["model_name"] = config.model_config.served_model_name
            except AttributeError:
                pass
            return config

        return create_engine_config

    patch_once(EngineArgs, "create_engine_config", wrap)
