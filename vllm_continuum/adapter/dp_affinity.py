"""Session affinity across the data-parallel ranks of one `vllm serve`.

A pin lives in one engine core. With `--data-parallel-size N`, vLLM's
front end picks an engine core per request (`DPLBAsyncMPClient.
get_core_engine_for_request`): by the `X-data-parallel-rank` header if the
client sent one, else by load (waiting + running, and it steers away from
engines whose KV cache is full, which pins inflate). Nothing keeps a
session's turns on one rank, so the next turn usually lands where its pin
is not.

The general plugin also loads in the API-server process, so it wraps that
method (vLLM 0.32 and 0.33 both have it, and both carry `session_id` and
`data_parallel_rank` on `EngineCoreRequest`): a request that has a session
and no explicit rank gets the rank `rank_for_session(session, N)`, a hash
of the session id (SHA-256, so every API-server process agrees); an
explicit rank (the header, or a router that sets it) wins; requests
without a session go to vLLM's balancer unchanged.

Only servers that run the continuum scheduler are affected (a stock
server's balancing is left alone). Set `CONTINUUM_DP_SESSION_AFFINITY=0`
to turn it off.
"""

from __future__ import annotations

import hashlib
import logging
import os

from vllm_continuum.adapter.patching import patch_once

logger = logging.getLogger("vllm.continuum.dp")
ENV_SWITCH = "CONTINUUM_DP_SESSION_AFFINITY"


def rank_for_session(session_id: str, num_ranks: int) -> int:
    """The DP rank of a session: the same in every process and every run."""
    if num_ranks <= 1:
        return 0
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % num_ranks


def choose_rank(session_id: str | None, explicit_rank: int | None, num_ranks: int) -> int | None:
    """The rank to force on a request, or None to leave it to vLLM's balancer."""
    if explicit_rank is not None or not session_id or num_ranks <= 1:
        return explicit_rank
    return rank_for_session(session_id, num_ranks)


def runs_continuum(vllm_config) -> bool:
    """Whether the server was asked for the continuum scheduler."""
    name = getattr(getattr(vllm_config, "scheduler_config", None), "scheduler_cls", None)
    return isinstance(name, str) and (name == "continuum" or name.startswith("vllm_continuum."))


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def install() -> bool:
    """Wrap the DP load balancer's engine choice; False if this vLLM has none."""
    if not enabled():
        return False
    try:
        from vllm.v1.engine.core_client import DPLBAsyncMPClient
    except ImportError:  # a vLLM without internal DP load balancing
        return False
    def wrap(stock):
        def get_core_engine_for_request(self, request):
            try:
                on = getattr(self, "_continuum_dp_affinity", None)
                if on is None:
                    on = self._continuum_dp_affinity = runs_continuum(
                        getattr(self, "vllm_config", None)
                    )
                if on and request.request_id not in getattr(self, "reqs_in_flight", {}):
                    rank = choose_rank(
                        getattr(request, "session_id", None),
                        request.data_parallel_rank,
                        len(self.core_engines),
                    )
                    if rank is not None and rank != request.data_parallel_rank:
                        request.data_parallel_rank = rank
            except Exception as exc:  # noqa: BLE001  (never fail a request for affinity)
                logger.debug("continuum: DP session affinity skipped (%r)", exc)
            return stock(self, request)

        return get_core_engine_for_request

    patch_once(DPLBAsyncMPClient, "get_core_engine_for_request", wrap)
    return True
