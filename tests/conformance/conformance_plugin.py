"""pytest plugin of the conformance tier: vLLM's own scheduler tests
(`tests/v1/core/` of vLLM's sdist, fetched by fetch.py) with every scheduler
they build made of one variant's class.

It plays the conftest of those tests, but it cannot be one: vLLM's test
package is also named `tests`, and its top-level conftest imports half of
vLLM's test world. So run.py loads it with `-p conformance_plugin`.

The variant comes from $CONTINUUM_CONFORMANCE_VARIANT (a key of VARIANTS);
each test's outcome goes to the JSON file $CONTINUUM_CONFORMANCE_REPORT.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

# The variants: None is vLLM's own classes (the baseline), a dict is ours
# with those settings, i.e. vllm_config.additional_config["continuum"].
VARIANTS: dict[str, dict | None] = {
    "vllm": None,
    "never+fcfs": {"ttl_policy": "never", "queue_order": "fcfs"},
    "defaults": {},
}

# The hub models the tests name for a plain text model: the local tiny
# model stands in for them (no network here). The multimodal and hybrid
# models they name have no local stand-in; those tests fail on every variant.
HUB_TEXT_MODELS = {"facebook/opt-125m", "facebook/opt-350m"}

_variant = os.environ.get("CONTINUUM_CONFORMANCE_VARIANT", "vllm")
_settings = VARIANTS[_variant]
_outcomes: dict[str, dict] = {}
_built: list[str] = []  # our schedulers built by the running test


def _our_classes(settings: dict) -> dict[str, type]:
    """vLLM's class name -> ours, built with `settings` in additional_config
    (where `config_from_vllm` reads them), recording that it ran."""
    from vllm_continuum.adapter.scheduler import ContinuumAsyncScheduler, ContinuumScheduler

    def with_settings(cls: type) -> type:
        class Variant(cls):
            def __init__(self, *args, **kwargs):
                config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
                config.additional_config = {**(config.additional_config or {}),
                                            "continuum": dict(settings)}
                _built.append(cls.__name__)
                super().__init__(*args, **kwargs)

        Variant.__name__ = Variant.__qualname__ = cls.__name__
        return Variant

    return {"Scheduler": with_settings(ContinuumScheduler),
            "AsyncScheduler": with_settings(ContinuumAsyncScheduler)}


def pytest_configure(config):
    from vllm_continuum.tools.tiny_model import build_tiny_model

    config._conformance_model = str(build_tiny_model(os.environ["CONTINUUM_TINY_MODEL_DIR"]))
    config._conformance_classes = _our_classes(_settings) if _settings is not None else {}


@pytest.fixture(autouse=True)
def _continuum_rebind(request, monkeypatch):
    """Rebind, in every loaded module of vLLM's test tree, the names the tests
    build schedulers and model configs with. Rebinding globals (not wrapping
    one helper) also reaches the helpers that call `Scheduler(...)` and
    `ModelConfig(...)` directly, e.g. `create_scheduler_with_priority`, and
    `utils.create_scheduler`, whose default class is `Scheduler`/`AsyncScheduler`
    and whose default model reaches `ModelConfig(model=...)`."""
    from vllm.config import ModelConfig

    model = request.config._conformance_model

    def model_config(*args, **kwargs):
        if kwargs.get("model") in HUB_TEXT_MODELS:
            kwargs["model"] = model
        return ModelConfig(*args, **kwargs)

    names = {"ModelConfig": model_config, **request.config._conformance_classes}
    for name, module in list(sys.modules.items()):
        if name.startswith("tests.v1.") and module is not None:
            for attr, value in names.items():
                if attr in vars(module):
                    monkeypatch.setattr(module, attr, value)
    _built.clear()


def pytest_runtest_logreport(report):
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "ours": False})
    if report.when == "teardown":  # fixtures may build the scheduler too
        entry["ours"] = bool(_built)
    if report.failed and entry["outcome"] != "failed":
        crash = getattr(report.longrepr, "reprcrash", None)
        text = str(report.longrepr)
        missing = re.search(r"fixture '[^']+' not found", text)  # a setup error has no crash line
        entry["outcome"] = "failed"
        entry["reason"] = (crash.message if crash is not None
                           else missing.group(0) if missing else text[-500:])
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_collectreport(report):
    # A test file that cannot even be imported counts as one failed test,
    # rather than silently shrinking the list.
    if report.failed:
        _outcomes[report.nodeid] = {"outcome": "failed", "ours": False,
                                    "reason": str(report.longrepr)[-500:]}


def pytest_sessionfinish(session):
    path = os.environ.get("CONTINUUM_CONFORMANCE_REPORT")
    if path:
        with open(path, "w") as out:
            json.dump({"variant": _variant, "tests": _outcomes}, out, indent=1)
