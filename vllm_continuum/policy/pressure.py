"""When an allocation that failed for lack of blocks may take them from pins.

Whatever the policy, pins give way before a running request would be
preempted: preemption throws away computed KV of a live request to keep KV
of an idle one. The policies differ for waiting requests:

- hold (the paper's Algorithm 1, the default): pins under the cap are kept
  while other work runs, since running work will free blocks soon and the
  pinned session's return saves a full prefill. Only the deadlock guard
  releases them: nothing runs, and the head of the queue cannot be admitted.
  Under memory pressure this measured better than yield (docs/benchmarks.md):
  yield gives the pins up nearly always, so they buy nothing.
- yield: always. Pins never delay admission; they only use memory nobody
  else wants. Never a delay for newcomers against stock vLLM.

Which pins go first (latest-arriving program) is `PinTable.release_order`.
"""

from __future__ import annotations

from typing import Literal

PressurePolicy = Literal["yield", "hold"]


def may_release_pins(policy: PressurePolicy, for_running_request: bool, anything_running: bool) -> bool:
    if for_running_request or policy == "yield":
        return True
    return not anything_running


def pressure_variants(name: str, settings: dict[str, str], key: str) -> dict[str, dict[str, str]]:
    """Benchmark labels for one policy: NAME under the configured pressure policy,
    NAME-yield and NAME-hold pinning one (`key` is where the setting goes), so
    that a label keeps its meaning when the default changes."""
    variants = {name: dict(settings)}
    for policy in ("yield", "hold"):
        variants[f"{name}-{policy}"] = {**settings, key: policy}
    return variants
