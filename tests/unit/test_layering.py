"""No import runs back up between our packages: core <- adapter <- plugin,
and the experiments' shared part <- live/ and sim/, which ignore each other.

Read from source (lazy imports included; `if TYPE_CHECKING:` blocks, which
never run, excluded), so every path is covered, not only the ones a test
happens to take."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import continuum_lab
import vllm_continuum

PACKAGE = Path(vllm_continuum.__file__).parent
LAB = Path(continuum_lab.__file__).parent


def _folder(folder: str) -> Path:
    """`core`, `adapter`, ... in the product; `continuum_lab/...` in the lab."""
    lab, _, rest = folder.partition("/")
    return LAB / rest if lab == "continuum_lab" else PACKAGE / folder


def _modules(folder: str) -> list[Path]:
    return sorted(_folder(folder).rglob("*.py"))


def _our_imports(path: Path) -> set[str]:
    """Our modules (or names in them) a file imports at run time."""
    tree = ast.parse(path.read_text())
    skip = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {n for n in names if n.startswith(("vllm_continuum.", "continuum_lab."))}


# folder -> the packages (prefixes) its modules may import
ALLOWED = {
    "core": ("vllm_continuum.core", "vllm_continuum.config"),
    "adapter": ("vllm_continuum.core", "vllm_continuum.config", "vllm_continuum.adapter",
                "vllm_continuum.metrics"),
    "metrics": ("vllm_continuum.metrics", "vllm_continuum.core"),
    # The API server's middleware: the hint names and the settings only.
    "frontend": ("vllm_continuum.frontend", "vllm_continuum.config", "vllm_continuum.core.hints"),
    # live/ reads a server's /metrics by the names the collector exports (constants only).
    "continuum_lab/live": ("continuum_lab.live", "continuum_lab.",
                         "vllm_continuum.core", "vllm_continuum.config", "vllm_continuum.tools",
                         "vllm_continuum.metrics.names"),
    "continuum_lab/sim": ("continuum_lab.sim", "continuum_lab.",
                        "vllm_continuum.core", "vllm_continuum.config", "vllm_continuum.adapter",
                        "vllm_continuum.metrics", "vllm_continuum.tools"),
}
FORBIDDEN = {
    "continuum_lab/live": ("continuum_lab.sim",),
    "continuum_lab/sim": ("continuum_lab.live",),
}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_only_run_down(folder):
    wrong = [
        f"{path} imports {name}"
        for path in _modules(folder)
        for name in sorted(_our_imports(path))
        if not name.startswith(ALLOWED[folder]) or name.startswith(FORBIDDEN.get(folder, ("-",)))
    ]
    assert not wrong


def test_the_shared_experiment_code_imports_neither_live_nor_sim():
    # commands.py only gathers every part's commands for the command line.
    shared = [p for p in _modules("continuum_lab")
              if p.parent.name in ("continuum_lab", "configs") and p.name != "commands.py"]
    assert shared
    wrong = [
        f"{p} imports {name}"
        for p in shared
        for name in _our_imports(p)
        if name.startswith(("continuum_lab.live", "continuum_lab.sim"))
    ]
    assert not wrong


def test_the_check_sees_a_back_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from continuum_lab.live import replay\n")
    assert _our_imports(bad) == {"continuum_lab.live"}
