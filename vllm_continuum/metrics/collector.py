"""The front end's view: a prometheus collector that reads the engine cores'
snapshots at scrape time.

Counters and histograms are the engines' own, summed over engine cores
(data parallelism). Pins are judged against the clock now, not when the
engine last stepped: in a snapshot written while the engine was idle, a pin
past its TTL (plus `EXPIRY_GRACE_S`) and not held for a queued turn is
already released in substance. It is reported as released (`expired`, held
for its TTL), exactly as the engine will count it when it next looks, so
that the gauges are true while the engine sleeps and the counters never go
back. A snapshot written while the engine works is at most a step (or
`PUBLISH_INTERVAL_S`) old, and the engine expires pins itself at each step.

The collector holds no state: every API-server process computes the same
figures from the same files, so with `--api-server-count N` it does not
matter which one answers a scrape.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from vllm_continuum.core.lost_pin import RESUME_SOURCES
from vllm_continuum.metrics import names
from vllm_continuum.metrics.snapshot import (
    BUCKETS,
    ENV_DIR,
    EXPIRY_GRACE_S,
    NO_CALL,
    Histogram,
    monotonic,
    read_snapshots,
)

RELEASE_REASONS = ("resumed", "expired", "pressure", "last_turn", "aborted", "reset", "replaced")
RESUME_OUTCOMES = ("pinned", "unpinned")
_LE = [floatToGoString(b) for b in BUCKETS] + ["+Inf"]
logger = logging.getLogger("vllm.continuum.metrics")


class Totals:
    """Snapshots added up, with pins judged at `now` (front-end monotonic clock)."""

    def __init__(self) -> None:
        self.engines = 0
        self.pool_blocks = 0
        self.pinned_blocks = 0
        self.pinned_sessions = 0
        self.pins_by_tool: Counter[str] = Counter()
        self.releases_by_reason: Counter[str] = Counter({r: 0 for r in RELEASE_REASONS})
        self.resumes_by_outcome: Counter[str] = Counter({o: 0 for o in RESUME_OUTCOMES})
        self.resume_sources: Counter[str] = Counter({s: 0 for s in RESUME_SOURCES})
        self.pin_reload_saved_s = 0.0
        self.resume_prompt_tokens = 0
        self.resume_cached_tokens = 0
        self.invalid_hints = 0
        # Exist at zero from start-up: a server whose agents never pin shows it.
        self.session_turns: Counter[tuple[str, str]] = Counter({("answer", NO_CALL): 0})
        self.pins_refused = 0
        self.reloadable_pins = 0
        self.block_shortages = 0
        self.affinity_misses = 0
        self.pin_outcomes_by_tool: Counter[tuple[str, str]] = Counter()
        self.expired_block_seconds_by_tool: Counter[str] = Counter()
        self.ttl_revisits: Counter[tuple[str, str]] = Counter()
        self.histograms = {
            "ttl_seconds": Histogram(),
            "tool_duration_seconds": Histogram(),
            "pin_held_seconds": Histogram(),
        }

    def add(self, snap: dict, now: float) -> None:
        self.engines += 1
        self.pool_blocks += int(snap.get("pool_blocks", 0))
        self.pins_by_tool.update(snap.get("pins_by_tool", {}))
        self.releases_by_reason.update(snap.get("releases_by_reason", {}))
        self.resumes_by_outcome.update(snap.get("resumes_by_outcome", {}))
        self.resume_sources.update(snap.get("resume_sources", {}))
        self.pin_reload_saved_s += float(snap.get("pin_reload_saved_s", 0.0))
        self.resume_prompt_tokens += int(snap.get("resume_prompt_tokens", 0))
        self.resume_cached_tokens += int(snap.get("resume_cached_tokens", 0))
        self.invalid_hints += int(snap.get("invalid_hints", 0))
        for outcome, call_format, count in snap.get("session_turns", ()):
            self.session_turns[(str(outcome), str(call_format))] += int(count)
        self.pins_refused += int(snap.get("pins_refused", 0))
        self.reloadable_pins += int(snap.get("reloadable_pins", 0))
        self.block_shortages += int(snap.get("block_shortages", 0))
        self.affinity_misses += int(snap.get("affinity_misses", 0))
        for tool, outcome, count in snap.get("pin_outcomes_by_tool", ()):
            self.pin_outcomes_by_tool[(str(tool), str(outcome))] += int(count)
        for tool, seconds in snap.get("expired_block_seconds_by_tool", {}).items():
            self.expired_block_seconds_by_tool[str(tool)] += float(seconds)
        for tool, decision, count in snap.get("ttl_revisits", ()):
            self.ttl_revisits[(str(tool), str(decision))] += int(count)
        for name, hist in self.histograms.items():
            for label, row in snap.get(name, {}).items():
                mine = hist.series.setdefault(label, [0] * (len(BUCKETS) + 1) + [0.0])
                for i, value in enumerate(row):
                    mine[i] += value
        # Seconds since the snapshot was written (system-wide monotonic clock).
        age = now - float(snap.get("mono", now))
        idle = bool(snap.get("idle"))
        for blocks, left_s, ttl_s, held, *rest in snap.get("pins", ()):
            if idle and not held and age >= left_s + EXPIRY_GRACE_S:
                self.releases_by_reason["expired"] += 1
                self.histograms["pin_held_seconds"].observe("", max(0.0, ttl_s))
                if len(rest) >= 3:  # the engine counts it so when it releases it
                    tool, own = str(rest[1]), float(rest[2])
                    self.pin_outcomes_by_tool[(tool, "expired")] += 1
                    self.expired_block_seconds_by_tool[tool] += own * max(0.0, ttl_s)
            else:
                self.pinned_blocks += float(blocks)
                self.pinned_sessions += 1


def _histogram(
    name: str, doc: str, hist: Histogram, model: str, label: str | None
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["model_name", *([label] if label else [])])
    series = dict(hist.series)
    if label is None and not series:
        series[""] = [0] * (len(BUCKETS) + 1) + [0.0]  # exists at zero from start-up
    for key, row in sorted(series.items()):
        cumulative, buckets = 0, []
        for le, count in zip(_LE, row[:-1]):
            cumulative += count
            buckets.append((le, cumulative))
        family.add_metric([model, *([key] if label else [])], buckets, row[-1])
    return family


class ContinuumCollector:
    """Registered on the registry that serves vLLM's `/metrics`."""

    def __init__(
        self,
        model_name: Callable[[], str],
        directory: Callable[[], str | None] = lambda: os.environ.get(ENV_DIR),
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._model_name = model_name
        self._directory = directory
        self._clock = clock
        self._warned = False

    def describe(self) -> list[Metric]:
        return []  # no I/O at registration; names are ours alone (continuum_*)

    def totals(self) -> Totals | None:
        directory = self._directory()
        if not directory:
            return None
        totals = Totals()
        now = self._clock()
        for snap in read_snapshots(directory):
            totals.add(snap, now)
        return totals if totals.engines else None

    def collect(self) -> list[Metric]:
        """Never raises: an exception here would turn vLLM's whole /metrics into a 500."""
        try:
            return list(self._families())
        except Exception as exc:  # noqa: BLE001  (a scrape must never fail)
            if not self._warned:
                self._warned = True
                logger.warning("continuum metrics: could not read the engine snapshots (%r)", exc)
            return []

    def _families(self) -> Iterator[Metric]:
        totals = self.totals()
        if totals is None:
            return  # no continuum engine: vLLM's /metrics stays as it was
        model = self._model_name()
        m = [model]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(m, value)
            return family

        def by(name: str, doc: str, label: str, values: Counter) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name", label])
            for key, count in sorted(values.items()):
                family.add_metric([model, key], count)
            return family

        yield by(
            names.PINS, "Pins created (a finished tool-call turn kept its KV blocks).",
            "tool", totals.pins_by_tool,
        )
        yield by(
            names.PIN_RELEASES,
            "Pins released, by reason: resumed, expired, pressure, last_turn, aborted, "
            "reset, replaced (a newer turn of the same session pinned).",
            "reason", totals.releases_by_reason,
        )
        yield by(
            names.EXPIRED_PIN_BLOCK_SECONDS,
            "KV block-seconds held by pins that expired before their session came back "
            "(memory a TTL spent for nothing), by tool.",
            "tool", totals.expired_block_seconds_by_tool,
        )
        for name, doc, labels, values in (
            (names.TOOL_PIN_OUTCOMES,
             "Pins released, by tool and outcome: resumed (handed over to the next turn), "
             "expired (TTL passed first), other (pressure, last turn, abort, reset, replaced).",
             ("tool", "outcome"), totals.pin_outcomes_by_tool),
            (names.TTL_REVISITS,
             "TTLs decided again when a revisable pin's TTL passed (ttl_policy: hazard), by tool "
             "and decision: held (a new TTL) or released.",
             ("tool", "decision"), totals.ttl_revisits),
            (names.SESSION_TURNS,
             "Finished turns of sessions, by outcome: tool_call (pinned unless its TTL is 0), with "
             "the format the call was recognised in (a family such as hermes or kimi_k2, a text "
             "format, pattern, token, forced, hint), or answer (format none: not pinned).",
             ("outcome", "format"), totals.session_turns),
        ):
            family = CounterMetricFamily(name, doc, labels=["model_name", *labels])
            for keys, count in sorted(values.items()):
                family.add_metric([model, *keys], count)
            yield family
        yield by(
            names.RESUMES,
            "Requests of a session that had a previous turn, by whether its pin was still held.",
            "outcome", totals.resumes_by_outcome,
        )
        yield by(
            names.RESUME_SOURCES,
            "Requests of a session that had a previous turn, by where its context came from: "
            "pinned (its pin), host_tier (loaded from vLLM's KV offload), gpu_cache (found in "
            "vLLM's prefix cache), recomputed (none of it found).",
            "source", totals.resume_sources,
        )
        yield counter(
            names.PIN_RELOAD_SAVED_SECONDS,
            "Seconds of host-tier reload that resumed pins saved (their context was also held "
            "by vLLM's KV offload: without the pin, their next turn would have loaded it).",
            totals.pin_reload_saved_s,
        )
        yield counter(
            names.RESUME_PROMPT_TOKENS,
            "Prompt tokens of resumed requests (denominator of the reuse ratio).",
            totals.resume_prompt_tokens,
        )
        yield counter(
            names.RESUME_CACHED_TOKENS,
            "Prompt tokens of resumed requests found in the prefix cache when admitted.",
            totals.resume_cached_tokens,
        )
        yield counter(
            names.INVALID_HINTS, "Per-request continuum hints ignored as invalid.",
            totals.invalid_hints,
        )
        yield counter(
            names.AFFINITY_MISSES,
            "Requests continuing a session whose earlier turn ran on another engine (its prompt "
            "holds tool results this engine never saw the session produce): broken affinity.",
            totals.affinity_misses,
        )
        yield counter(
            names.PINS_REFUSED,
            "Pins not made because they did not fit under max_pinned_fraction.",
            totals.pins_refused,
        )
        yield counter(
            names.RELOADABLE_PINS,
            "Pins made reloadable: vLLM's KV offload held their context and has been serving this "
            "tenant's lost pins back, so they give way to waiting requests under pressure_policy "
            "hold (reloadable_pins_yield). 0 without a host tier.",
            totals.reloadable_pins,
        )
        yield counter(
            names.BLOCK_SHORTAGES,
            "Allocations that failed for lack of free KV blocks, before any pin was released. "
            "While one happened in the last 5 s the pool is contested: ttl_policy hazard then "
            "prices a pin's memory (else it costs nothing).",
            totals.block_shortages,
        )
        for name, doc, value in (
            (names.PINNED_BLOCKS, "Distinct KV blocks held by pins now.", round(totals.pinned_blocks, 6)),
            (names.PINNED_SESSIONS, "Sessions holding a pin now.", totals.pinned_sessions),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(m, value)
            yield gauge
        if totals.pool_blocks:
            gauge = GaugeMetricFamily(
                names.KV_POOL_BLOCKS,
                "KV blocks in the pool the pins draw from (for a pinned fraction).",
                labels=["model_name"],
            )
            gauge.add_metric(m, totals.pool_blocks)
            yield gauge
        for name, doc, label in (
            (names.TTL_SECONDS, "TTLs chosen for finished tool-call turns (0: not pinned).", "tool"),
            (names.TOOL_DURATION_SECONDS,
             "Measured tool durations: end of a turn to the arrival of the session's next.", "tool"),
            (names.PIN_HELD_SECONDS,
             "How long pins were held (an expired pin: its TTL).", None),
        ):
            key = name.removeprefix("continuum_")
            yield _histogram(name, doc, totals.histograms[key], model, label)
