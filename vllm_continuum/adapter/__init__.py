"""The only product code that imports vLLM: the scheduler hooks, the block
ledger over vLLM's pool, the plugin entry point, the version check and the
launcher. Each hook forwards to `vllm_continuum.core`."""
