"""`matrix --report offload`: each policy against stock vLLM with the same host tier.

With vLLM's KV offload on (`NAME+offload-TIER` labels, host_tier.py), the
baseline an operator already runs is stock vLLM with that tier
(`stock+offload-TIER`). Per cell and host tier, each policy's figures over
the seeds (geometric means of per-seed ratios, as the matrix's):

- `stock+offload / JCT`: stock with the tier's mean JCT over the policy's;
  its worst seed;
- the worst program: its JCT over its own under stock with the tier, the
  worst of all programs and seeds; the share of programs over 10% slower
  (worst seed);
- `stock / JCT`: against stock without offload, as the other tables read;
- where later turns' prompt tokens came from, summed over the seeds: the
  GPU's prefix cache (pins included), the host tier, computed again.

Rows without a tier (`stock`, `default`) appear under every tier, judged
against that tier's stock. The targets (issue 47): what ships with the tier
at least 1.5x stock with the tier in the overload cells, and no seed of any
cell below 1.00x.
"""

from __future__ import annotations

import math

from continuum_lab.outcomes import SLOWER, geomean
from continuum_lab.sim.policies import OFFLOAD, split_offload

TARGET_GAIN = 1.5
SHIPPED = "default"


def _fmt(x: float, spec: str = "{:.2f}x") -> str:
    return spec.format(x) if math.isfinite(x) else "-"


def _tier_of(label: str) -> str | None:
    _, tier = split_offload(label)
    return tier.label if tier is not None else None


def _program_ratios(row: dict, base: dict) -> list[float]:
    mine, theirs = row.get("program_jct_s") or {}, base.get("program_jct_s") or {}
    return [jct / theirs[p] for p, jct in mine.items() if theirs.get(p, 0) > 0]


def _sources(rows: list[dict]) -> str:
    totals = {k: sum(r.get("resume_tokens", {}).get(k, 0) for r in rows)
              for k in ("gpu", "host_tier", "computed")}
    n = sum(totals.values())
    return " / ".join(f"{v / n:.0%}" for v in totals.values()) if n else "-"


def policy_figures(rows: dict[int, dict], base: dict[int, dict], stock: dict[int, dict]) -> dict:
    """One policy's figures in one cell and tier; rows, base, stock: by seed."""
    seeds = sorted(set(rows) & set(base))
    ratios = [base[s]["jct_mean_s"] / rows[s]["jct_mean_s"] for s in seeds]
    programs = [_program_ratios(rows[s], base[s]) for s in seeds]
    return {
        "jct_mean_s": geomean([rows[s]["jct_mean_s"] for s in seeds]),
        "gain": geomean(ratios),
        "worst": min(ratios, default=math.nan),
        "worst_program": max((max(r) for r in programs if r), default=math.nan),
        "slower": max((sum(x > SLOWER for x in r) / len(r) for r in programs if r), default=math.nan),
        "vs_stock": geomean([stock[s]["jct_mean_s"] / rows[s]["jct_mean_s"]
                             for s in seeds if s in stock]),
        "sources": _sources([rows[s] for s in seeds]),
    }


def offload_cells(rows: list[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """cell -> tier -> policy -> figures, in the rows' order."""
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for cell in dict.fromkeys(r["cell"] for r in rows):
        by = {}
        for r in rows:
            if r["cell"] == cell:
                by.setdefault(r["label"], {})[r["seed"]] = r
        stock = by.get("stock", {})
        tiers = dict.fromkeys(t for label in by if (t := _tier_of(label)) is not None)
        for tier in tiers:
            base = next((runs for label, runs in by.items()
                         if label.startswith("stock" + OFFLOAD) and _tier_of(label) == tier), None)
            if base is None:
                continue
            out.setdefault(cell, {})[tier] = {
                label: policy_figures(runs, base, stock) for label, runs in by.items()
                if _tier_of(label) in (tier, None)}
    return out


def offload_tables(rows: list[dict]) -> list[str]:
    cells = offload_cells(rows)
    head = ["host tier", "policy", "mean JCT s", "stock+offload / JCT", "worst seed",
            "worst program / its stock+offload JCT", "programs >10% slower (worst seed)",
            "stock / JCT", "later turns' prompt: GPU / host / computed"]
    text: list[str] = []
    for cell, tiers in cells.items():
        text += [f"### {cell}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for tier, policies in tiers.items():
            for label, f in policies.items():
                text.append(
                    f"| {tier} | {label} | {f['jct_mean_s']:.1f} | {_fmt(f['gain'], '{:.3f}x')} | "
                    f"{_fmt(f['worst'])} | {_fmt(f['worst_program'])} | {_fmt(f['slower'], '{:.0%}')} | "
                    f"{_fmt(f['vs_stock'])} | {f['sources']} |")
        text.append("")
    return text + targets_table(cells)


def targets_table(cells: dict[str, dict[str, dict[str, dict]]]) -> list[str]:
    """What ships with the tier against stock with it, cell by cell: the issue's targets."""
    head = ["cell", "host tier", "stock+offload / JCT", "worst seed", "worst program / its stock+offload JCT",
            "targets missed"]
    lines = [f"### Targets: `{SHIPPED}{OFFLOAD}` against `stock{OFFLOAD}` with the same tier", "",
             f"(at least {TARGET_GAIN}x in the overload cells; no seed of any cell below 1.00x)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell, tiers in cells.items():
        for tier, policies in tiers.items():
            f = next((f for label, f in policies.items()
                      if split_offload(label)[0] == SHIPPED and _tier_of(label) == tier), None)
            if f is None:
                continue
            missed = []
            if " overload " in cell and not f["gain"] >= TARGET_GAIN:
                missed.append(f"mean JCT >= {TARGET_GAIN}x")
            if not f["worst"] >= 1.0:
                missed.append("a seed below 1.00x")
            lines.append(f"| {cell} | {tier} | {_fmt(f['gain'], '{:.3f}x')} | {_fmt(f['worst'])} | "
                         f"{_fmt(f['worst_program'])} | {'; '.join(missed) or 'none'} |")
    return lines
