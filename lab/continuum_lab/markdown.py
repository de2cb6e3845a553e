"""A Markdown table from a header and rows of cells, as the reports print them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    return "\n".join([row(head), "|" + "---|" * len(head), *(row(cells) for cells in rows)])
