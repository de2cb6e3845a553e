"""Whether a commit changed only docstrings and comments of its Python files:
each changed .py file's syntax tree before and after, docstrings removed,
must be equal (comments never reach the tree).

    python scripts/same_code.py COMMIT

Prints one line per changed .py file and exits 1 if any differs in code.
"""

from __future__ import annotations

import ast
import subprocess
import sys


def tree_without_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            body[0] = ast.Pass()
    return ast.dump(tree)


def at(rev: str, path: str) -> str | None:
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def main(commit: str) -> int:
    changed = subprocess.check_output(["git", "diff", "--name-only", f"{commit}^", commit], text=True).split()
    differing = 0
    for path in (p for p in changed if p.endswith(".py")):
        before, after = at(f"{commit}^", path), at(commit, path)
        same = before is not None and after is not None and (
            tree_without_docstrings(before) == tree_without_docstrings(after))
        differing += not same
        print(("same code    " if same else "CODE CHANGED ") + path)
    return 1 if differing else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
