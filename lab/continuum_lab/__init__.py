"""The lab: what the scheduler does for agent workloads, measured two ways.
It is its own distribution (lab/pyproject.toml, `vllm-continuum-lab`), on top
of the product (`vllm_continuum`), which never imports it; its commands join
`vllm-continuum` through commands.py.

- `live/`: replay a trace against running vLLM servers over HTTP (`bench`),
  or start stock vLLM and continuum one after the other and compare them
  (`compare`); the CPU benchmark model.
- `sim/`: drive the real schedulers (stock vLLM's and continuum's) with
  synthetic model outputs, a step-time cost model and a simulated clock,
  one engine or N behind a router (`sim`, `overhead`, `fit-cost-model`).

Both read the same traces and write the same results, so this package holds
what they share: the trace format (trace_format.py), traces generated from
workload specs (workload_spec.py) or converted from recorded transcripts
(transcripts.py), a run's records (results.py), the report and plots
(report.py), the shipped workload specs and cost models (configs/), and the
commands that only make traces (cli.py: `workload`, `convert`).

live/ and sim/ import this shared part and never each other; the shared part
imports neither.
"""
