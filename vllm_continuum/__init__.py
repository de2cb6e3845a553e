"""vllm-continuum: keep an agent session's KV cache pinned across tool calls.

Importing this package does not import vLLM; `vllm_continuum.adapter.scheduler` does.
"""

__version__ = "0.1.0"
