"""Live benchmarks: a trace replayed over HTTP against running servers (replay.py),
stock vLLM against continuum on the same trace (compare.py), and the model they
serve on a CPU (bench_model.py). Commands: cli.py."""
