"""What the package needs where: the scheduler path inside vLLM imports none
of the client-side libraries that only the extras bring (pyproject.toml), and
a command run without its extra says which one to install."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import vllm_continuum
from vllm_continuum.cli import LAB_COMMANDS, main

CLIENT_LIBRARIES = ("openai", "tqdm", "httpx")
PACKAGE_ROOT = Path(vllm_continuum.__file__).parents[1]


def _source(module: str) -> Path | None:
    """Our module's file, found without importing anything (or None: not a module)."""
    path = PACKAGE_ROOT.joinpath(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str) -> set[str]:
    """Every absolute import in `module`'s source, at any depth (lazy ones too)."""
    names = set()
    for node in ast.walk(ast.parse(_source(module).read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _reach(start: str) -> tuple[set[str], list[str]]:
    """Our modules `start` can import, following our own imports from source
    (lazy ones included), and which of them import a client library."""
    reached, todo, offending = set(), [start], []
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for name in _imports(module):
            if name.partition(".")[0] in CLIENT_LIBRARIES:
                offending.append(f"{module} imports {name}")
            parts = name.split(".")
            if parts[0] == "vllm_continuum":  # the module, or a name in it
                todo += [".".join(parts[:i]) for i in range(1, len(parts) + 1)
                         if _source(".".join(parts[:i]))]
    return reached, offending


def test_plugin_and_scheduler_import_no_client_library():
    """Read from source, so every path vLLM may take is covered (vLLM imports
    these libraries itself, so `sys.modules` could not tell)."""
    reached, offending = _reach("vllm_continuum.adapter.plugin")
    assert not offending
    assert {"vllm_continuum.adapter.scheduler", "vllm_continuum.metrics.collector"} <= reached
    packages = {m.split(".")[1] for m in reached if m.count(".")}
    assert not packages & {"agent", "demos", "tools", "cluster", "bench", "sim", "experiments"}
    assert _reach("vllm_continuum.demos.pause_demo")[1]  # the check sees an import


def test_a_command_without_its_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now fails
    monkeypatch.delitem(sys.modules, "vllm_continuum.demos.pause_scenario", raising=False)
    monkeypatch.delitem(sys.modules, "vllm_continuum.demos.pause_demo", raising=False)
    with pytest.raises(SystemExit, match=r"pause-demo needs openai: pip install 'vllm-continuum\[demo\]'"):
        main(["pause-demo"])


def test_the_lab_adds_the_commands_the_cli_names_for_it():
    import argparse

    from continuum_lab.commands import register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    assert sorted(sub.choices) == sorted(LAB_COMMANDS)


def test_without_the_lab_its_commands_say_how_to_install_it(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.partition(".")[0] == "continuum_lab"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "continuum_lab", None)  # `import continuum_lab` now fails
    for argv in (["sim", "--quick"], ["scale-bench", "--help"], ["compare"]):
        with pytest.raises(SystemExit, match=rf"{argv[0]} is a command of the lab .*: pip install \./lab"):
            main(argv)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "matrix              (in the lab, not installed)" in capsys.readouterr().out


@pytest.mark.parametrize("command", [
    "demo", "pause-demo", "serve", "cluster", "profile", "tiny-model", *LAB_COMMANDS,
])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: vllm-continuum {command}" in capsys.readouterr().out


def _build_wheel(project: Path, out: Path) -> list[str]:
    """The files of `project`'s wheel, built offline with this interpreter's setuptools."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(out), str(project)],
                   check=True, timeout=120)
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_product_wheel_holds_the_product_only_and_the_lab_its_data(tmp_path):
    """Built from copies of the two projects (the checkout gets no build/ folder):
    the product's wheel has no lab module and no cost model; the lab's has
    its workload specs and cost models."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("the build needs setuptools >= 77 (pyproject.toml's build-system)")
    if not (PACKAGE_ROOT / "lab" / "pyproject.toml").is_file():
        pytest.skip("not run from a checkout")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    product = tmp_path / "product"
    product.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PACKAGE_ROOT / name, product)
    shutil.copytree(PACKAGE_ROOT / "vllm_continuum", product / "vllm_continuum", ignore=ignore)
    lab = tmp_path / "lab"
    shutil.copytree(PACKAGE_ROOT / "lab", lab, ignore=ignore)

    files = _build_wheel(product, tmp_path / "product-wheel")
    tops = {name.split("/")[0] for name in files}
    assert tops == {"vllm_continuum", "vllm_continuum-0.1.0.dist-info"}
    assert "vllm_continuum/adapter/scheduler.py" in files
    assert not [name for name in files if "cost_model" in name or name.endswith(".yaml")]

    files = _build_wheel(lab, tmp_path / "lab-wheel")
    assert {name.split("/")[0] for name in files} == {"continuum_lab", "vllm_continuum_lab-0.1.0.dist-info"}
    assert "continuum_lab/configs/cost_models/h100-llama3.1-8b.yaml" in files
    assert "continuum_lab/configs/workloads/swebench.yaml" in files
    assert "continuum_lab/configs/matrix.yaml" in files
