"""Settings that shipped before and that labels still name, for the live
benchmark (`compare` flavours) and the simulator (`sim` policies) alike: a
published result keeps its meaning after the defaults change; and the labels
that pin the pressure policy (`pressure_variants`)."""

from __future__ import annotations

# The learned TTL with the `pressure` pin cost, as it shipped until the pin cost became `demand`
# (docs/results/benchmarks-archive.md, "Charged on demand"): `default-pressure`, and every label
# that ran the learned TTL before.
PRESSURE = {"ttl_policy": "continuum", "pin_cost": "pressure"}
# The learned TTL charged on demand, from then until `forever` shipped
# (docs/results/benchmarks-archive.md, "Pinned until the next turn"): `default-demand`.
DEMAND = {"ttl_policy": "continuum", "pin_cost": "demand"}
# The pin caps from the start until they opened to 0.95 / 1.0 (docs/results/benchmarks-archive.md,
# "Opening the caps"): `default-capped`, and every simulator label that ran before.
CAPPED = {"max_pinned_fraction": 0.5, "max_session_pinned_fraction": 0.25}


def pressure_variants(name: str, settings: dict[str, str], key: str) -> dict[str, dict[str, str]]:
    """Benchmark labels for one policy: NAME under the configured pressure policy,
    NAME-yield and NAME-hold pinning one (`key` is where the setting goes), so
    that a label keeps its meaning when the default changes."""
    variants = {name: dict(settings)}
    for policy in ("yield", "hold"):
        variants[f"{name}-{policy}"] = {**settings, key: policy}
    return variants
