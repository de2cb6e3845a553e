"""Whether two `vllm-continuum matrix` runs gave the same figures: every
field of every (cell, seed, policy) row, compared exactly (NaN equals NaN).

    python scripts/same_figures.py runs/before/matrix.json runs/after/matrix.json

Prints one line per row and exits 1 if any row differs or either run has a
row the other lacks. The simulator is deterministic, so a change that
alters no decision gives the same figures to the last digit.
"""

from __future__ import annotations

import json
import math
import sys


def rows(path: str) -> dict[tuple, dict]:
    with open(path) as f:
        return {(r["cell"], r["seed"], r["label"]): r for r in json.load(f)["rows"]}


def same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def main(before: str, after: str) -> int:
    a, b = rows(before), rows(after)
    differing = 0
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            print(f"ONLY IN {'after' if key in b else 'before'}: {key}")
            differing += 1
            continue
        fields = [f for f in a[key].keys() | b[key].keys() if not same(a[key].get(f), b[key].get(f))]
        differing += bool(fields)
        cell, seed, label = key
        verdict = "same" if not fields else "DIFFERENT: " + ", ".join(sorted(fields))
        print(f"{verdict:10} {cell}, seed {seed}, {label}: mean JCT "
              f"{a[key]['jct_mean_s']:.6f} s / {b[key]['jct_mean_s']:.6f} s")
    print(f"{len(a.keys() | b.keys())} rows, {differing} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
