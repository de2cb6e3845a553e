"""`vllm-continuum cluster`: N continuum vLLM servers behind vLLM's router, on one machine.

    vllm-continuum cluster --instances 2 MODEL [--policy consistent_hash] [-- VLLM FLAGS...]

Starts N `vllm serve MODEL --scheduler-cls continuum` instances (ports
`--base-port`, +1, ...), each publishing its KV cache events on a local
ZMQ socket (for `--policy kv_aware`), then `vllm-router` (the vLLM
project's router, `pip install 'vllm-continuum[cluster]'`) in front of
them on `--port`. Prints every address, writes one log per process under
`--log-dir`, and stops everything on Ctrl-C (or when any process dies).

It is for trying the combination on one machine; in production, run the
instances and the router the way your platform runs services (see
docs/scaling.md). The router's `consistent_hash` and `kv_aware` policies
both keep a session on one instance: the client sends the session id as
the `X-Session-ID` header (our agent loop does), which is also the header
vLLM itself reads as `session_id`.
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Sequence
from pathlib import Path

ROUTER_POLICIES = ("consistent_hash", "kv_aware", "round_robin", "cache_aware", "power_of_two",
                   "random", "sticky_least_loaded")


def register(sub) -> None:
    p = sub.add_parser(
        "cluster",
        help="N continuum vLLM servers behind vllm-router on this machine (Ctrl-C stops all)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--policy", choices=ROUTER_POLICIES, default="consistent_hash",
                   help="vllm-router policy (default: consistent_hash on X-Session-ID)")
    p.add_argument("--port", type=int, default=8000, help="the router's port")
    p.add_argument("--base-port", type=int, default=8100, help="instance i listens on this + i")
    p.add_argument("--log-dir", type=Path, default=Path("runs/cluster"))
    p.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                   help="extra vllm-router argument (repeat), e.g. --router-arg=--enable-program-scheduling")
    p.add_argument("--no-kv-events", action="store_true",
                   help="do not publish KV events (kv_aware needs them)")
    p.set_defaults(run=run, needs="cluster")


def run(args: argparse.Namespace, vllm_args: Sequence[str]) -> int:
    # Imported here: `vllm-continuum --help` must not need the cluster's dependencies.
    from vllm_continuum.cluster.local_cluster import Cluster, router_executable, vllm_flag

    if args.instances < 1:
        raise SystemExit("--instances must be at least 1")
    if args.policy == "kv_aware" and args.no_kv_events:
        raise SystemExit("--policy kv_aware needs the instances' KV events")
    router_executable()  # fail before starting anything
    cluster = Cluster(
        args.model, args.instances, args.log_dir, list(vllm_args), base_port=args.base_port,
        kv_events=not args.no_kv_events,
    )
    stop = {"now": False, "serving": False}

    def on_signal(*_):
        stop["now"] = True
        if not stop["serving"]:  # still starting: interrupt the wait at once
            raise KeyboardInterrupt

    # Ctrl-C (SIGINT), a closed terminal (SIGHUP) and SIGTERM all stop everything;
    # SIGINT is set explicitly because a shell starts background jobs with it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        print(f"starting {args.instances} continuum instance(s); logs in {args.log_dir}/", flush=True)
        cluster.start_instances()
        for i, s in enumerate(cluster.servers):
            kv = cluster.kv_event_sources.get(s.base_url)
            kv = f"  KV events {kv}" if kv else ""
            print(f"  instance {i}: {s.base_url}  (metrics {s.base_url}/metrics){kv}", flush=True)
        block_size = vllm_flag(vllm_args, "--block-size")
        router = cluster.start_router(args.policy, args.router_arg, port=args.port,
                                      block_size=int(block_size) if block_size else None)
        stop["serving"] = True
        print(f"  router ({args.policy}): {router.base_url}/v1  log {router.log_path}", flush=True)
        print("send the session id as the X-Session-ID header; Ctrl-C stops everything", flush=True)
        while not stop["now"]:
            for proc in [s.process for s in cluster.servers] + [router.process]:
                if proc is not None and proc.poll() is not None:
                    print(f"a process exited (code {proc.returncode}); stopping", flush=True)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130 if not stop["serving"] else 0
    finally:
        print("stopping the router and the instances", flush=True)
        cluster.stop()
    return 0
