"""PrefillReload(r): seconds to prefill a context again, from a fitted profile.

Prefill time grows about quadratically with context length (attention), so
the profile is t(n) = c0 + c1 n + c2 n², fitted by `vllm-continuum profile`
on the server's own model and hardware. Without a profile the default below
is used: an 8B model on one H100-class GPU, roughly 10k prefill tokens/s,
rounded down, so that with no profile the model pins less rather than more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class PrefillProfile:
    c0: float = 0.005
    c1: float = 8e-5
    c2: float = 1e-9
    source: str = "default (8B model on one H100-class GPU, not measured here)"
    points: list[tuple[int, float]] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if not all(math.isfinite(c) for c in (self.c0, self.c1, self.c2)):
            raise ValueError(f"prefill profile coefficients must be finite: {self}")

    def seconds(self, num_tokens: int) -> float:
        """The fitted t(n), made non-decreasing: max of t over [0, n]. A fit with
        a negative quadratic (or linear) term would otherwise claim that a
        longer context reloads faster, down to 0 for the longest ones."""
        n = max(0, num_tokens)
        best = max(self._fit(n), self._fit(0))
        if self.c2 < 0:  # concave: its peak may lie inside [0, n]
            best = max(best, self._fit(min(n, max(0.0, -self.c1 / (2 * self.c2)))))
        return max(0.0, best)

    def _fit(self, n: float) -> float:
        return self.c0 + self.c1 * n + self.c2 * n * n

    def clamp_note(self, max_tokens: int) -> str | None:
        """A message if the fit decreases somewhere on [0, max_tokens], where
        `seconds` holds it at its running maximum instead."""
        slopes = (self.c1, self.c1 + 2 * self.c2 * max_tokens)  # t'(n) is linear
        if min(slopes) >= 0:
            return None
        return (
            f"prefill profile ({self.source}) decreases on [0, {max_tokens}] tokens "
            f"(c1={self.c1:.3g}, c2={self.c2:.3g}); its reload cost is held at its running "
            "maximum. Refit it over the whole context range: `vllm-continuum profile`."
        )

    @classmethod
    def fit(cls, points: list[tuple[int, float]], source: str) -> PrefillProfile:
        """Least-squares quadratic through (tokens, seconds) points."""
        import numpy as np

        if len({n for n, _ in points}) < 3:
            raise ValueError("a quadratic fit needs at least 3 distinct context lengths")
        x = np.array([n for n, _ in points], dtype=float)
        y = np.array([t for _, t in points], dtype=float)
        c2, c1, c0 = np.polyfit(x, y, 2)
        return cls(float(c0), float(c1), float(c2), source, sorted(points))

    def fit_error(self) -> tuple[float, float]:
        """(RMSE in seconds, mean relative error) of the fit on its own points."""
        if not self.points:
            return 0.0, 0.0
        errs = [(self.seconds(n) - t) for n, t in self.points]
        rmse = (sum(e * e for e in errs) / len(errs)) ** 0.5
        rel = sum(abs(e) / max(t, 1e-9) for e, (_, t) in zip(errs, self.points)) / len(errs)
        return rmse, rel

    def save(self, path: Path) -> None:
        rmse, rel = self.fit_error()
        data = {
            "model": "t(n) = c0 + c1*n + c2*n^2 seconds, n = context tokens",
            "c0": self.c0, "c1": self.c1, "c2": self.c2,
            "source": self.source,
            "fit_rmse_s": rmse, "fit_mean_relative_error": rel,
            "points": [[n, t] for n, t in self.points],
        }
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

    @classmethod
    def load_or_default(cls, path: Path | str | None) -> PrefillProfile:
        """The profile at `path`, or the unprofiled default when there is none."""
        return cls.load(path) if path else cls()

    @classmethod
    def load(cls, path: Path | str) -> PrefillProfile:
        data = yaml.safe_load(Path(path).read_text())
        try:
            return cls(
                float(data["c0"]), float(data["c1"]), float(data["c2"]),
                str(data.get("source", path)),
                [(int(n), float(t)) for n, t in data.get("points", [])],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a prefill profile (needs c0, c1, c2): {exc}") from exc
