"""No import runs back up between our packages: core <- adapter <- plugin,
the product (vllm_continuum) <- the lab (continuum_lab), and in the lab its
shared part <- live/ and sim/, which ignore each other.

Read from source (lazy imports included; `if TYPE_CHECKING:` blocks, which
never run, excluded), so every path is covered, not only the ones a test
happens to take."""

from __future__ import annotations

import ast
import re
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


def _shown(path: Path) -> str:
    for root in (PACKAGE.parent, LAB.parent):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return str(path)


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
    return {n for n in names if n.startswith(("vllm_continuum.", "continuum_lab.")) or n == "continuum_lab"}


# folder -> the packages (prefixes) its modules may import
ALLOWED = {
    "core": ("vllm_continuum.core", "vllm_continuum.config"),
    "adapter": ("vllm_continuum.core", "vllm_continuum.config", "vllm_continuum.adapter",
                "vllm_continuum.metrics"),
    "metrics": ("vllm_continuum.metrics", "vllm_continuum.core"),
    # The API server's middleware: the hint names, the tool parsers' names and the settings only.
    "frontend": ("vllm_continuum.frontend", "vllm_continuum.config", "vllm_continuum.core.hints",
                 "vllm_continuum.core.tool_calls"),
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
        f"{_shown(path)} imports {name}"
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
        f"{_shown(p)} imports {name}"
        for p in shared
        for name in _our_imports(p)
        if name.startswith(("continuum_lab.live", "continuum_lab.sim"))
    ]
    assert not wrong


def test_the_check_sees_a_back_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from continuum_lab.live import replay\n")
    assert _our_imports(bad) == {"continuum_lab.live"}


def _lab_references(path: Path) -> set[str]:
    """What a file imports of the lab (every import statement, `TYPE_CHECKING`
    ones too), and the lab's module names it spells as strings (quoted)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.partition(".")[0] == "continuum_lab")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.partition(".")[0] == "continuum_lab":
                found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.partition(".")[0] == "continuum_lab":
                found.add(repr(node.value))
    return found


def test_the_product_never_imports_the_lab():
    """The lab depends on the product, never the other way round. The one
    place the product names the lab is the command line's optional hook: it
    adds the lab's commands when `continuum_lab.commands` imports."""
    from vllm_continuum.cli import LAB_MODULE

    found = {path.relative_to(PACKAGE).as_posix(): _lab_references(path)
             for path in sorted(PACKAGE.rglob("*.py"))}
    found = {path: names for path, names in found.items() if names}
    assert found == {"cli.py": {repr(LAB_MODULE), repr("continuum_lab")}}


def test_core_and_adapter_define_nothing_only_the_lab_uses():
    """Every top-level name of core/ and adapter/ that the lab uses is used by
    the product too (elsewhere in the product, or again in its own module):
    what only the benchmarks need belongs in the lab."""
    product = {path: path.read_text() for path in PACKAGE.rglob("*.py")}
    lab = "\n".join(path.read_text() for path in LAB.rglob("*.py"))
    only_lab = []
    for folder in ("core", "adapter"):
        for path in sorted(_modules(folder)):
            for node in ast.parse(product[path]).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names = [node.name]
                elif isinstance(node, ast.Assign):
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names = [node.target.id]
                else:
                    continue
                for name in names:
                    word = re.compile(rf"\b{re.escape(name)}\b")
                    if not word.search(lab):
                        continue
                    used = len(word.findall(product[path])) > 1 or any(
                        word.search(text) for other, text in product.items() if other != path)
                    if not used:
                        only_lab.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert not only_lab


def test_the_lab_checks_see_a_lab_reference(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import continuum_lab\n"
                   "if TYPE_CHECKING:\n    from continuum_lab.sim.run import simulate\n"
                   "MODULE = 'continuum_lab.commands'\n"
                   "DOC = 'see continuum_lab/sim/run.py'\n")
    assert _lab_references(bad) == {"continuum_lab", "continuum_lab.sim.run",
                                    repr("continuum_lab.commands")}
    assert _our_imports(bad) == {"continuum_lab"}
