"""`vllm-continuum calibrate`: a running engine's step time, measured over HTTP
and fitted into a simulator cost model (docs/calibration.md).

    server.py   the pool and scheduler limits the server reports
    probes.py   the measurements: cold and extended prefills by TTFT, decode
                steps by inter-token gaps of B concurrent streams
    fit.py      the linear step model fitted to them, with its error
    command.py  the command: measure, fit, write the YAML with its provenance
    sizing.py   `vllm-continuum sizing`: a workload's re-prefill against decode, and
                pool against contexts, on a calibrated cost model
"""
