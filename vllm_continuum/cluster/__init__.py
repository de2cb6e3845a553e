"""Scale-out: several continuum servers behind a router (docs/scaling.md).

    command.py          `vllm-continuum cluster`: the command line
    local_cluster.py    the instances, vllm-router and the KV-event relays, as local processes
    scenario.py         agent sessions through the router while other traffic cycles the pools
    instance_header.py  `X-Continuum-Instance` response header (which server answered)
    pins_endpoint.py    `GET /continuum/pins`: pins held now, by session digest, with expiry

instance_header and pins_endpoint are ASGI middleware that vLLM's API server
loads (`--middleware vllm_continuum.cluster.pins_endpoint.PinsEndpoint`);
nothing here imports vLLM. Nothing is imported here either, so loading the
middleware does not pull in the launcher's dependencies.
"""
