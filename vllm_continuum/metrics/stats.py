"""What the pin machinery did, recorded by the scheduler as it happens.

The scheduler reports events through the `on_*` methods and offers its
state to `publish` after each step; how figures reach Prometheus is this
module's concern, not the scheduler's. Plain Python so tests and
benchmarks read the counters directly.

Export: when `CONTINUUM_METRICS_DIR` names a directory (the plugin sets it
in the API-server process; engine cores inherit it), `publish` writes this
process's snapshot there (`vllm_continuum.metrics.snapshot`), while the
engine works at most every `PUBLISH_INTERVAL_S` and in at most
`PUBLISH_TIME_SHARE` of its time (a snapshot costs O(pins)), and at once
when it goes idle,
since an idle engine stops stepping and would otherwise leave the last
changes unwritten. Nothing is written, and nothing costs more than a
comparison, on a step where nothing changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter

from vllm_continuum.metrics.snapshot import (
    EXPIRY_GRACE_S,
    FORMAT,
    NO_CALL,
    PUBLISH_INTERVAL_S,
    PUBLISH_TIME_SHARE,
    Histogram,
    SnapshotWriter,
    ToolLabels,
    monotonic,
    pin_rows,
    writer_from_env,
)
from vllm_continuum.core.pin_table import Pin, ReleaseReason

_NOT_RECLASSIFIED = (ReleaseReason.EXPIRED, ReleaseReason.RESUMED)


@dataclass
class ContinuumStats:
    # Keyed by tool label: the first MAX_TOOL_LABELS names, then "__other__".
    pins_by_tool: Counter[str] = field(default_factory=Counter)
    releases_by_reason: Counter[str] = field(default_factory=Counter)
    resumes_by_outcome: Counter[str] = field(default_factory=Counter)  # pinned / unpinned
    # Where resumed turns' contexts came from (core/lost_pin.py RESUME_SOURCES).
    resume_sources: Counter[str] = field(default_factory=Counter)
    # The host-tier reload time resumed pins saved (their context was held there too).
    pin_reload_saved_s: float = 0.0
    resume_prompt_tokens: int = 0
    resume_cached_tokens: int = 0
    invalid_hints: int = 0
    # Finished session turns, by (outcome, format): ("tool_call", how the call
    # was recognised: a format of core/tool_calls, `pattern`, `forced`, `hint`)
    # or ("answer", "none").
    session_turns: Counter[tuple[str, str]] = field(default_factory=Counter)
    pins_refused_by_cap: int = 0
    # Pins made reloadable: the host tier would serve them back, so they give
    # way to waiting requests under hold (core/reloadable.py).
    reloadable_pins: int = 0
    # Allocations that failed for lack of free blocks, before any pin was
    # released: while one is recent the pool is contested (hazard prices pins).
    block_shortages: int = 0
    # Revisited TTLs (a revisable pin's TTL passed and its policy decided
    # again), by (tool label, "held" or "released").
    ttl_revisits: Counter[tuple[str, str]] = field(default_factory=Counter)
    # What each tool's pins came to, by (tool label, "resumed", "expired" or
    # "other"), and the KV block-seconds held by pins that expired (waste).
    pin_outcomes_by_tool: Counter[tuple[str, str]] = field(default_factory=Counter)
    expired_block_seconds_by_tool: Counter[str] = field(default_factory=Counter)
    # Requests continuing a session whose earlier turn ran on another engine
    # (vllm_continuum.core.affinity): a router broke the session's affinity.
    affinity_misses: int = 0
    # Recent events, newest last (bounded: the oldest half goes when full).
    ttl_decisions: list[tuple[str, float, str]] = field(default_factory=list)
    tool_durations: list[tuple[str, float]] = field(default_factory=list)
    max_kept_events: int = 1000
    # Distributions, in the buckets Prometheus will show (seconds).
    ttl_seconds: Histogram = field(default_factory=Histogram)  # by tool
    tool_duration_seconds: Histogram = field(default_factory=Histogram)  # by tool
    pin_held_seconds: Histogram = field(default_factory=Histogram)  # one series, ""
    # Where snapshots go; None: not exported (unit tests, offline use).
    writer: SnapshotWriter | None = field(default_factory=writer_from_env)

    def __post_init__(self) -> None:
        self._tool_label = ToolLabels()
        self._changes = 0  # bumped by every event
        self._written_changes = -1
        self._written_idle: bool | None = None
        self._written_at = float("-inf")
        self._interval = PUBLISH_INTERVAL_S  # grows with what a snapshot costs
        self._published_idle = True  # the engine starts idle
        if self.writer is not None:
            # The metrics exist (at zero) from start-up, before any request.
            self._write(pins=(), pool_size=0, now=0.0, idle=True, kept_past_ttl=lambda _: False)

    # --- events ------------------------------------------------------------
    def on_pin(self, pin: Pin) -> None:
        self.pins_by_tool[self._tool_label(pin.tool)] += 1
        self.reloadable_pins += pin.reloadable
        self._changes += 1

    def on_pin_refused(self, tool: str) -> None:
        self.pins_refused_by_cap += 1
        self._changes += 1

    def on_blocks_short(self) -> None:
        self.block_shortages += 1
        self._changes += 1

    def on_release(self, pin: Pin, reason: ReleaseReason, now: float) -> None:
        """Count a release; a pin whose TTL passed long ago counts as expired.

        While the engine is idle the front end (if exported) reports a pin as expired
        `EXPIRY_GRACE_S` after its TTL (the engine has not looked yet). If the
        engine later lets it go for another reason (reset_prefix_cache,
        shutdown), it is counted as the expiry the front end already showed,
        so that no counter decreases. The same is true in substance: its TTL
        had passed with no next turn queued.
        """
        if (
            reason not in _NOT_RECLASSIFIED
            and self.writer is not None
            and self._published_idle
            and now >= pin.expires_at + EXPIRY_GRACE_S
        ):
            reason = ReleaseReason.EXPIRED
        self.releases_by_reason[reason.value] += 1
        expired = reason == ReleaseReason.EXPIRED
        # An expired pin was useful for its TTL; the lazy release time is noise.
        held_s = pin.expires_at - pin.created_at if expired else now - pin.created_at
        self.pin_held_seconds.observe("", max(0.0, held_s))
        tool = self._tool_label(pin.tool)
        outcome = reason.value if reason in _NOT_RECLASSIFIED else "other"
        self.pin_outcomes_by_tool[(tool, outcome)] += 1
        if expired:
            self.expired_block_seconds_by_tool[tool] += pin.num_blocks * max(0.0, held_s)
        elif reason == ReleaseReason.RESUMED:
            self.pin_reload_saved_s += pin.held.reload_s
        self._changes += 1

    def on_resume(self, had_pin: bool, prompt_tokens: int, cached_tokens: int,
                  source: str = "") -> None:
        self.resumes_by_outcome["pinned" if had_pin else "unpinned"] += 1
        if source:
            self.resume_sources[source] += 1
        self.resume_prompt_tokens += prompt_tokens
        self.resume_cached_tokens += cached_tokens
        self._changes += 1

    def on_affinity_miss(self) -> None:
        self.affinity_misses += 1
        self._changes += 1

    def on_invalid_hints(self, count: int) -> None:
        self.invalid_hints += count
        self._changes += 1

    def on_turn_outcome(self, call_format: str | None) -> None:
        """A session's turn finished, in a call recognised in `call_format`, or not (None)."""
        outcome = ("tool_call", call_format) if call_format else ("answer", NO_CALL)
        self.session_turns[outcome] += 1
        self._changes += 1

    def on_ttl_decision(self, tool: str, ttl_s: float, source: str) -> None:
        self._keep(self.ttl_decisions, (tool, ttl_s, source))
        self.ttl_seconds.observe(self._tool_label(tool), max(0.0, ttl_s))
        self._changes += 1

    def on_ttl_revisit(self, tool: str, more_s: float) -> None:
        self.ttl_revisits[(self._tool_label(tool), "held" if more_s > 0 else "released")] += 1
        self._changes += 1

    def on_tool_duration(self, tool: str, seconds: float) -> None:
        self._keep(self.tool_durations, (tool, seconds))
        self.tool_duration_seconds.observe(self._tool_label(tool), max(0.0, seconds))
        self._changes += 1

    # --- state -------------------------------------------------------------
    def publish(
        self,
        pins: Iterable[Pin],
        pool_size: int,
        now: float,
        idle: bool,
        kept_past_ttl: Callable[[Pin], bool],
    ) -> None:
        """The scheduler's state after a step; `kept_past_ttl(pin)` tells whether a
        pin is kept past its TTL for a queued turn. Called on every step:
        returns after two comparisons unless a snapshot is due."""
        self._published_idle = idle
        if self.writer is None:
            return
        if self._changes == self._written_changes and idle == self._written_idle:
            return
        # Going idle or waking up is written at once; changes while busy, at
        # most every interval (an idle publish catches the rest).
        if (
            not idle
            and idle == self._written_idle
            and monotonic() - self._written_at < self._interval
        ):
            return
        self._write(pins, pool_size, now, idle, kept_past_ttl)

    def snapshot(
        self, pins: Iterable[Pin], pool_size: int, now: float, idle: bool, kept_past_ttl
    ) -> dict:
        """What the front end needs, as JSON-ready data (format: metrics/snapshot.py)."""
        return {
            "format": FORMAT,
            "mono": monotonic(),
            "clock": now,
            "idle": idle,
            "pool_blocks": pool_size,
            "pins": pin_rows(pins, now, kept_past_ttl, self._tool_label),
            "pins_by_tool": dict(self.pins_by_tool),
            "releases_by_reason": dict(self.releases_by_reason),
            "resumes_by_outcome": dict(self.resumes_by_outcome),
            "resume_sources": dict(self.resume_sources),
            "pin_reload_saved_s": self.pin_reload_saved_s,
            "resume_prompt_tokens": self.resume_prompt_tokens,
            "resume_cached_tokens": self.resume_cached_tokens,
            "invalid_hints": self.invalid_hints,
            "session_turns": [[o, f, n] for (o, f), n in self.session_turns.items()],
            "pins_refused": self.pins_refused_by_cap,
            "reloadable_pins": self.reloadable_pins,
            "block_shortages": self.block_shortages,
            "pin_outcomes_by_tool": [[t, o, n] for (t, o), n in self.pin_outcomes_by_tool.items()],
            "expired_block_seconds_by_tool": dict(self.expired_block_seconds_by_tool),
            "ttl_revisits": [[t, d, n] for (t, d), n in self.ttl_revisits.items()],
            "affinity_misses": self.affinity_misses,
            "ttl_seconds": self.ttl_seconds.to_json(),
            "tool_duration_seconds": self.tool_duration_seconds.to_json(),
            "pin_held_seconds": self.pin_held_seconds.to_json(),
        }

    def _write(self, pins, pool_size: int, now: float, idle: bool, kept_past_ttl) -> None:
        assert self.writer is not None
        changes = self._changes
        started = perf_counter()
        self.writer.write(self.snapshot(pins, pool_size, now, idle, kept_past_ttl))
        self._interval = max(PUBLISH_INTERVAL_S, (perf_counter() - started) / PUBLISH_TIME_SHARE)
        # Even a failed write is not retried every step (a gone directory
        # stays gone); the next change tries again.
        self._written_changes = changes
        self._written_idle = idle
        self._written_at = monotonic()

    def _keep(self, events: list, event: tuple) -> None:
        if len(events) >= self.max_kept_events:
            del events[: self.max_kept_events // 2]
        events.append(event)
