"""Pin and eviction metrics on vLLM's own `/metrics`.

    snapshot.py      the file format and writer (engine core side; plain Python)
    collector.py     the prometheus collector that reads snapshots at scrape time
    names.py         the metric names (the collector exports them, grafana/generate.py queries them)
    stats.py         `ContinuumStats`: the scheduler's events, written as snapshots

`vllm_continuum.adapter.metrics_registration` wires the collector into vLLM
from the general plugin. Nothing is imported here: the engine core imports
`snapshot` on its step path and must not pull in prometheus_client.
"""
