"""Discrete-event simulation that drives the real schedulers (stock vLLM's and
ours) with synthetic model outputs (driver.py), a step-time cost model
(cost_model.py) and a simulated clock: the event loop (loop.py) over one
engine or N (instance.py) behind a router (routing.py), each policy's
scheduler (policies.py, oracle.py), and the commands' runs and reports
(run.py, cluster.py, overhead.py; cli.py)."""
