"""The documentation stays true to the code: the settings table is what the
model renders, and every relative link of README.md, docs/*.md and docs/results/*.md resolves
(files, and headings for `#anchors` into Markdown)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.config_reference import BEGIN, DOC, END, main, render_table, splice

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs/results").glob("*.md"))]


def test_committed_table_is_what_the_model_renders(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_every_setting_has_a_row_with_a_meaning():
    table = render_table()
    for name, field in ContinuumConfig.model_fields.items():
        assert field.description, f"{name} has no description: it would have no meaning in the table"
        assert f"| `{name}` |" in table


def test_check_fails_on_a_stale_table(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(f"intro\n{BEGIN}\n| old |\n{END}\nrest\n")
    assert main(["--check", "--doc", str(stale)]) == 1
    assert main(["--doc", str(stale)]) == 0
    assert stale.read_text() == f"intro\n{BEGIN}\n{render_table()}{END}\nrest\n"
    assert main(["--check", "--doc", str(stale)]) == 0
    capsys.readouterr()


def test_splice_needs_both_markers():
    with pytest.raises(ValueError):
        splice(f"{BEGIN}\nno end", "| table |\n")


def test_table_document_is_among_the_checked_documents():
    assert DOC in DOCUMENTS


# ------------------------------------------------------------------ links
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(path: Path) -> str:
    """The document without fenced code blocks (their `#` lines are not headings)."""
    return _FENCE.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _relative_links(path: Path) -> list[str]:
    text = _CODE.sub("", _prose(path))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    broken = []
    for link in _relative_links(document):
        target, _, anchor = link.partition("#")
        resolved = (document.parent / target).resolve() if target else document
        if not resolved.exists():
            broken.append(f"{link}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{link}: no heading #{anchor} in {resolved.name}")
        elif ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{link}: outside the repository")
    assert not broken, "\n".join(broken)


def test_link_checker_sees_links_and_anchors(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text(
        "# Title\n## How it *works* (here)\n## Title\n"
        "[x](b.md) [y](#how-it-works-here) [z](#title-1) [w](https://example.com)\n"
        "`[not](a link)`\n```\n# not a heading\n[nor](this.md)\n```\n"
    )
    assert _anchors(doc) == {"title", "how-it-works-here", "title-1"}
    assert _relative_links(doc) == ["b.md", "#how-it-works-here", "#title-1"]


def test_experimental_settings_are_settings_and_listed_apart():
    from vllm_continuum.config import EXPERIMENTAL, ContinuumConfig
    from vllm_continuum.config_reference import render_table

    assert EXPERIMENTAL <= set(ContinuumConfig.model_fields)
    operator, experimental = render_table().split("**Experimental**")
    for name in ContinuumConfig.model_fields:
        assert (f"| `{name}` |" in experimental) is (name in EXPERIMENTAL), name
        assert (f"| `{name}` |" in operator) is (name not in EXPERIMENTAL), name
