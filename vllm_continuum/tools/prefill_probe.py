"""`vllm-continuum profile`: measure PrefillReload on a running server.

Sends prompts of growing length (random token ids, so nothing is a prefix
hit) with `max_tokens=1` and times them; the time is dominated by the
prefill. Fits t(n) = c0 + c1 n + c2 n² and writes it as YAML for the
`prefill_profile` setting. Measure on the server's own model and hardware,
with no other traffic: the fit is what the TTL model will believe a reload
costs.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from vllm_continuum.core.prefill_profile import PrefillProfile


def served_model(base_url: str) -> tuple[str, int]:
    card = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]
    return card["id"], int(card.get("max_model_len") or 4096)


# The longest prompt leaves this many tokens of the window free (for the output).
WINDOW_MARGIN = 16


def default_lengths(max_model_len: int) -> list[int]:
    """Doubling lengths from 128 up to the longest prompt the server takes."""
    top = max_model_len - WINDOW_MARGIN
    lengths, n = [], 128
    while n < top:
        lengths.append(n)
        n *= 2
    return [*lengths, top]


def measure(
    base_url: str,
    lengths: list[int] | None = None,
    repeats: int = 3,
    token_range: tuple[int, int] = (300, 2000),
    seed: int = 0,
) -> PrefillProfile:
    model, max_model_len = served_model(base_url)
    lengths = lengths or default_lengths(max_model_len)
    rng = random.Random(seed)
    points: list[tuple[int, float]] = []
    with httpx.Client(base_url=base_url, timeout=600) as client:
        # One warm-up request: the first request of a server pays one-off costs.
        client.post("/v1/completions", json={"model": model, "prompt": [301, 302], "max_tokens": 1})
        for n in tqdm([n for n in lengths for _ in range(repeats)], desc="profile", unit="req"):
            prompt = [rng.randrange(*token_range) for _ in range(n)]
            started = time.perf_counter()
            response = client.post(
                "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1}
            )
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            points.append((n, elapsed))
    return PrefillProfile.fit(points, source=f"measured on {base_url} ({model})")


def report(profile: PrefillProfile) -> str:
    rmse, rel = profile.fit_error()
    lines = [
        f"t(n) = {profile.c0:.4g} + {profile.c1:.4g}*n + {profile.c2:.4g}*n^2 seconds",
        f"fit: RMSE {rmse * 1000:.1f} ms, mean relative error {rel:.1%} over {len(profile.points)} points",
        "tokens   measured_s  fitted_s",
    ]
    lines += [f"{n:>6}   {t:>9.4f}  {profile.seconds(n):>8.4f}" for n, t in profile.points]
    return "\n".join(lines)


def run(base_url: str, out: Path, lengths: list[int] | None, repeats: int) -> int:
    profile = measure(base_url.rstrip("/"), lengths, repeats)
    profile.save(out)
    print(report(profile))
    print(f"\nwrote {out}; use it with CONTINUUM_PREFILL_PROFILE={out}")
    return 0
