"""`vllm-continuum calibrate`: a running engine's step time, measured over HTTP
and fitted into a simulator cost model (docs/calibration.md).

    server.py        the pool and scheduler limits the server reports
    grid.py          which probes to run on that server
    probes.py        the measurements: cold and extended prefills by TTFT, decode
                     steps by inter-token gaps of B concurrent streams
    fit.py           the linear step model fitted to them, with its error
    fit_report.py    what the command prints: every point beside the fit, the noise
    command.py       the command: measure, fit, write the YAML with its provenance
    speed_probe.py   a few of the probes around each `compare` replay: how much slower
                     than its cost model the machine ran then (`predict` scales by it)
    bench_server.py  `--bench-server`: the CPU benchmark's server, started for it
    sizing.py        `vllm-continuum sizing`: a workload's re-prefill against decode, and
                     pool against contexts, on a calibrated cost model
    cli.py           both commands' arguments
"""
