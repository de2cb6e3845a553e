"""Builds grafana/dashboards/vllm-continuum.json with grafana-foundation-sdk.

    .venv/bin/python grafana/generate.py           # rewrite the JSON
    .venv/bin/python grafana/generate.py --check   # exit 1 if the JSON is stale

The dashboard is code so that its PromQL lives in one reviewed place; the
generated JSON is committed (Grafana imports JSON) and a test checks that
it matches this script and that every expression evaluates on a real
Prometheus scraping a real vLLM server (tests/engine/test_engine_metrics.py).
Every panel filters on the `model_name` variable, as vLLM's metrics do, and
on `instance` (Prometheus's target label: one vLLM server each; "All" by
default), so one dashboard reads one server or a whole cluster; the
"Cluster" row compares instances. Our metric names are imported from
vllm_continuum/metrics/names.py, the collector's own, so the package must be
importable (it is in the project's .venv).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from vllm_continuum.metrics.names import (
    AFFINITY_MISSES,
    BLOCK_SHORTAGES,
    EXPIRED_PIN_BLOCK_SECONDS,
    INVALID_HINTS,
    KV_POOL_BLOCKS,
    PIN_HELD_SECONDS,
    PIN_RELEASES,
    PIN_RELOAD_SAVED_SECONDS,
    PINNED_BLOCKS,
    PINNED_SESSIONS,
    PINS,
    PINS_REFUSED,
    RELOADABLE_PINS,
    RESUME_CACHED_TOKENS,
    RESUME_PROMPT_TOKENS,
    RESUME_SOURCES,
    RESUMES,
    SESSION_TURNS,
    TOOL_DURATION_SECONDS,
    TOOL_PIN_OUTCOMES,
    TTL_REVISITS,
    TTL_SECONDS,
)

OUT = Path(__file__).parent / "dashboards" / "vllm-continuum.json"
UID = "vllm-continuum"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
M = 'model_name="$model_name",instance=~"$instance"'
RI = "$__rate_interval"


def q(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def total(counter: str) -> str:
    """A counter as Prometheus scrapes it."""
    return f"{counter}_total"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{{{M}{extra}}}[{RI}])"


def quantiles(metric: str, by: str = "") -> list[prometheus.Dataquery]:
    group = f"le, {by}" if by else "le"
    label = f"{{{{{by}}}}} " if by else ""
    return [
        q(
            f"histogram_quantile({p}, sum by ({group}) ({rate(metric + '_bucket')}))",
            f"{label}p{int(p * 100)}",
            ref,
        )
        for p, ref in ((0.5, "A"), (0.9, "B"))
    ]


def series(title: str, description: str, targets, unit: str, w: int = 12, h: int = 8):
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .min(0)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def distribution(title: str, description: str, metric: str):
    """A heatmap of a continuum histogram: how many observations per bucket."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(12)
        .height(8)
        .with_target(
            q(f"sum by (le) (increase({metric}_bucket{{{M}}}[{RI}]))", "{{le}}")
            .format(PromQueryFormat.HEATMAP)
        )
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit("s"))
        .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges"))
    )


def big(title: str, description: str, expr: str, unit: str):
    """A one-number panel: the last value of `expr`."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(6)
        .height(4)
        .unit(unit)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(q(expr, title))
    )


def build() -> dashboard.Dashboard:
    pinned_vs_usage = series(
        "Pinned KV blocks vs vLLM KV usage",
        f"Fraction of the KV pool held by pins ({PINNED_BLOCKS} / {KV_POOL_BLOCKS}) "
        "beside vLLM's own vllm:kv_cache_usage_perc, which counts pinned blocks as used. The gap "
        "is what running and queued requests hold.",
        [
            q(f"sum({PINNED_BLOCKS}{{{M}}}) / sum({KV_POOL_BLOCKS}{{{M}}})",
              "pinned (fraction of pool)", "A"),
            q(f"avg(vllm:kv_cache_usage_perc{{{M}}})", "vLLM KV cache usage", "B"),
        ],
        "percentunit",
    ).max(1)
    pinned_now = series(
        "Pinned sessions and blocks",
        "Sessions holding a pin and the KV blocks they hold, now. Computed at scrape time: a pin "
        "whose TTL passed while the engine was idle is no longer counted.",
        [
            q(f"sum({PINNED_SESSIONS}{{{M}}})", "sessions", "A"),
            q(f"sum({PINNED_BLOCKS}{{{M}}})", "blocks", "B"),
        ],
        "short",
    )
    releases = series(
        "Pin outcomes by reason",
        "Pins released per second, by reason: resumed (the session's next turn took the blocks: "
        "the win), expired (TTL passed first), pressure (other work needed the blocks, or the "
        "pinned-fraction cap), last_turn, aborted, reset, replaced (a newer turn of the session "
        "pinned). Pins created, by tool, for scale.",
        [
            q(f"sum by (reason) ({rate(total(PIN_RELEASES))})", "{{reason}}", "A"),
            q(f"sum({rate(total(PINS))})", "pins created", "B"),
        ],
        "ops",
    ).draw_style(GraphDrawStyle.BARS).fill_opacity(60).stacking(
        StackingConfig().mode(StackingMode.NORMAL)
    )
    calls = rate(total(SESSION_TURNS), ',outcome="tool_call"')
    answers = rate(total(SESSION_TURNS), ',outcome="answer"')
    turns = series(
        "Session turns: tool calls by format, answers",
        f"Finished turns of sessions per second ({total(SESSION_TURNS)}): those that ended in a "
        "tool call, by the format it was recognised in (a model family such as hermes or "
        "kimi_k2, a text format, pattern, forced, hint), and answers. Agents that call tools "
        "but show only answers here run a model whose format is not recognised: the start-up "
        "log line `continuum: tool calls:` says which setting it needs.",
        [
            q(f"sum by (format) ({calls})", "{{format}} tool calls", "A"),
            q(f"sum({answers})", "answers", "B"),
        ],
        "ops",
    )
    pinned_resumes = rate(total(RESUMES), ',outcome="pinned"')
    hit_rate = series(
        "Resume hit rate",
        "Of the requests that continue a session (it had a previous turn), the share that found "
        f'the session\'s pin still held ({total(RESUMES)}{{outcome="pinned"}}).',
        [
            q(
                f"sum({pinned_resumes}) / sum({rate(total(RESUMES))})",
                "pinned / all resumes",
            )
        ],
        "percentunit",
    ).max(1)
    reuse = series(
        "Reuse ratio of resumed turns",
        "Prompt tokens of resumed requests found in the prefix cache, over their prompt tokens. "
        "Beside it, vLLM's prefix-cache hit rate over all requests.",
        [
            q(
                f"sum({rate(total(RESUME_CACHED_TOKENS))}) "
                f"/ sum({rate(total(RESUME_PROMPT_TOKENS))})",
                "resumed turns (continuum)", "A",
            ),
            q(
                f"sum({rate('vllm:prefix_cache_hits_total')}) "
                f"/ sum({rate('vllm:prefix_cache_queries_total')})",
                "all requests (vLLM prefix cache)", "B",
            ),
        ],
        "percentunit",
    ).max(1)
    sources = series(
        "Where resumed turns' contexts came from",
        f"Requests continuing a session per second, by source ({total(RESUME_SOURCES)}): pinned "
        "(its pin), host_tier (loaded from vLLM's KV offload to host memory), gpu_cache (found in "
        "vLLM's prefix cache), recomputed (none of it found). With KV offload on, beside them: "
        f"seconds of host reload the resumed pins saved, per second ({total(PIN_RELOAD_SAVED_SECONDS)}), "
        f"and pins made reloadable ({total(RELOADABLE_PINS)}: the host tier serves their tenant's "
        "lost pins back, so they give way to waiting requests), per second.",
        [
            q(f"sum by (source) ({rate(total(RESUME_SOURCES))})", "{{source}}", "A"),
            q(f"sum({rate(total(PIN_RELOAD_SAVED_SECONDS))})", "reload seconds saved / s", "B"),
            q(f"sum({rate(total(RELOADABLE_PINS))})", "reloadable pins / s", "C"),
        ],
        "short",
    )
    ttl_dist = distribution(
        "TTL distribution",
        "TTLs chosen for finished tool-call turns, per bucket (0: the policy chose not to pin).",
        TTL_SECONDS,
    )
    tool_dist = distribution(
        "Tool duration distribution",
        "Measured tool durations (end of a turn to the arrival of the session's next turn), per "
        "bucket. TTLs should sit where most durations end.",
        TOOL_DURATION_SECONDS,
    )
    ttl_by_tool = series(
        "TTL vs tool duration by tool (p50, p90)",
        "Median and 90th percentile of the chosen TTL and of the measured tool duration, by tool.",
        [
            *[t.legend_format("TTL " + t.build().legend_format) for t in
              quantiles(TTL_SECONDS, "tool")],
            *[t.ref_id(r).legend_format("duration " + t.build().legend_format)
              for t, r in zip(quantiles(TOOL_DURATION_SECONDS, "tool"), "CD")],
        ],
        "s",
    )
    handed_or_expired = rate(total(TOOL_PIN_OUTCOMES), ',outcome!="other"')
    outcomes_by_tool = series(
        "Pins by tool: handed over vs expired",
        f"Pins released per second, by tool: resumed (the next turn took the blocks over) and "
        f"expired (the TTL passed first; {total(TOOL_PIN_OUTCOMES)}). A tool whose pins mostly "
        "expire outlasts its TTL: the pins hold memory for nothing.",
        [q(f"sum by (tool, outcome) ({handed_or_expired})", "{{tool}} {{outcome}}")],
        "ops",
    )
    waste_by_tool = series(
        "Memory held by pins that expired, by tool",
        f"KV blocks held on average by pins that later expired ({total(EXPIRED_PIN_BLOCK_SECONDS)}: "
        "block-seconds per second), and, with ttl_policy: hazard, decisions revisited per second, "
        "by tool and outcome (held on, or released).",
        [
            q(f"sum by (tool) ({rate(total(EXPIRED_PIN_BLOCK_SECONDS))})", "{{tool}} blocks wasted", "A"),
            q(f"sum by (tool, decision) ({rate(total(TTL_REVISITS))})", "{{tool}} revisit {{decision}}/s", "B"),
        ],
        "short",
    )
    held = series(
        "Pin held time (p50, p90)",
        "How long pins held their blocks before release (an expired pin counts its TTL).",
        quantiles(PIN_HELD_SECONDS),
        "s",
    )
    ttft = series(
        "Time to first token (vLLM)",
        "vLLM's own vllm:time_to_first_token_seconds: what pinning is for. Compare with the hit "
        "rate and the reuse ratio.",
        [
            q(
                f"histogram_quantile({p}, sum by (le) "
                f"({rate('vllm:time_to_first_token_seconds_bucket')}))",
                f"p{int(p * 100)}", ref,
            )
            for p, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
        ],
        "s",
    )
    hints = series(
        "Invalid hints, refused pins, pool shortages",
        "Per-request continuum_* hints ignored as invalid, pins not made because they did "
        "not fit under max_pinned_fraction, and allocations that failed for lack of free KV "
        "blocks (the pool is contested: ttl_policy hazard prices pins' memory for 5 s after "
        "one), per second.",
        [
            q(f"sum({rate(total(INVALID_HINTS))})", "invalid hints", "A"),
            q(f"sum({rate(total(PINS_REFUSED))})", "pins refused (cap)", "B"),
            q(f"sum({rate(total(BLOCK_SHORTAGES))})", "allocations short of blocks", "C"),
        ],
        "ops",
    )
    pinned_stat = big(
        "Pinned sessions now", "Sessions holding a pin at the last scrape.",
        f"sum({PINNED_SESSIONS}{{{M}}})", "short",
    )
    hit_stat = big(
        "Resume hit rate (range)",
        "Pinned resumes over all resumes, over the dashboard's time range.",
        f'sum(increase({total(RESUMES)}{{{M},outcome="pinned"}}[$__range])) '
        f"/ sum(increase({total(RESUMES)}{{{M}}}[$__range]))",
        "percentunit",
    )
    reuse_stat = big(
        "Reuse ratio (range)",
        "Cached over prompt tokens of resumed requests, over the time range.",
        f"sum(increase({total(RESUME_CACHED_TOKENS)}{{{M}}}[$__range])) "
        f"/ sum(increase({total(RESUME_PROMPT_TOKENS)}{{{M}}}[$__range]))",
        "percentunit",
    )
    expired_stat = big(
        "Pins expired (range)",
        "Pins whose TTL passed before the session came back, over the time range.",
        f'sum(increase({total(PIN_RELEASES)}{{{M},reason="expired"}}[$__range]))',
        "short",
    )

    # --- Cluster: one series per instance (a vLLM server, i.e. its engine cores).
    pins_by_instance = series(
        "Pins and pinned sessions by instance",
        "Pins created per second and sessions holding a pin now, per instance. Behind a router "
        "that keeps sessions on one instance (consistent hashing on X-Session-ID, or KV-aware "
        "routing with session affinity), these follow the sessions each instance owns.",
        [
            q(f"sum by (instance) ({rate(total(PINS))})", "{{instance}} pins/s", "A"),
            q(f"sum by (instance) ({PINNED_SESSIONS}{{{M}}})",
              "{{instance}} pinned sessions", "B"),
        ],
        "short",
    )
    resumes_by_instance = series(
        "Resumes by instance: pinned vs unpinned",
        "Requests continuing a session this instance had seen, per second, by whether the "
        "session's pin was still held here (pinned) or not (unpinned).",
        [q(f"sum by (instance, outcome) ({rate(total(RESUMES))})",
           "{{instance}} {{outcome}}")],
        "ops",
    )
    share_by_instance = series(
        "Pinned-block share by instance",
        f"Fraction of each instance's KV pool held by pins ({PINNED_BLOCKS} / "
        f"{KV_POOL_BLOCKS}). Uneven shares mean uneven session placement.",
        [q(f"sum by (instance) ({PINNED_BLOCKS}{{{M}}}) "
           f"/ sum by (instance) ({KV_POOL_BLOCKS}{{{M}}})", "{{instance}}")],
        "percentunit",
    ).max(1)
    affinity = series(
        "Broken session affinity by instance",
        f"{total(AFFINITY_MISSES)}: requests whose prompt holds tool results of turns "
        "this instance never served (the session's previous turn ran elsewhere, where its pin "
        "now waits for nothing). Should be 0 behind a session-affine router; round robin "
        "or load-only balancing makes it climb. Beside it, pinned resumes for scale.",
        [
            q(f"sum by (instance) ({rate(total(AFFINITY_MISSES))})",
              "{{instance}} affinity misses/s", "A"),
            q(f"sum({rate(total(AFFINITY_MISSES))}) / (sum("
              f"{rate(total(AFFINITY_MISSES))}) + sum({rate(total(RESUMES))}))",
              "share of continuing turns that moved (all)", "B"),
        ],
        "short",
    )
    misses_stat = big(
        "Affinity misses (range)",
        "Turns that continued a session on an instance that did not serve its previous turn, "
        "over the time range, all selected instances.",
        f"sum(increase({total(AFFINITY_MISSES)}{{{M}}}[$__range]))",
        "short",
    )

    return (
        dashboard.Dashboard("vLLM continuum: KV pins across tool calls")
        .uid(UID)
        .description(
            "Pin and eviction metrics of the vllm-continuum scheduler plugin, beside vLLM's own "
            "KV usage and time to first token."
        )
        .tags(["vllm", "continuum", "kv-cache"])
        .refresh("10s")
        .time("now-30m", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("model_name")
            .label("Model")
            .datasource(DS)
            .query(f"label_values({PINNED_BLOCKS}, model_name)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
        .with_variable(
            dashboard.QueryVariable("instance")
            .label("Instance")
            .datasource(DS)
            .query(f'label_values({PINNED_BLOCKS}{{model_name="$model_name"}}, instance)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_row(dashboard.Row("Now"))
        .with_panel(pinned_stat)
        .with_panel(hit_stat)
        .with_panel(reuse_stat)
        .with_panel(expired_stat)
        .with_row(dashboard.Row("KV memory"))
        .with_panel(pinned_vs_usage)
        .with_panel(pinned_now)
        .with_row(dashboard.Row("Outcomes"))
        .with_panel(releases)
        .with_panel(turns)
        .with_panel(hit_rate)
        .with_panel(reuse)
        .with_panel(sources)
        .with_panel(ttft)
        .with_row(dashboard.Row("TTLs and tools"))
        .with_panel(ttl_dist)
        .with_panel(tool_dist)
        .with_panel(ttl_by_tool)
        .with_panel(outcomes_by_tool)
        .with_panel(waste_by_tool)
        .with_panel(held)
        .with_panel(hints)
        .with_row(dashboard.Row("Cluster"))
        .with_panel(pins_by_instance)
        .with_panel(resumes_by_instance)
        .with_panel(share_by_instance)
        .with_panel(affinity)
        .with_panel(misses_stat.span(24))
    )


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
