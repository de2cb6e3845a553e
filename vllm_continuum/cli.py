"""`vllm-continuum`: the project's command line.

    vllm-continuum demo [--stock]      agent sessions through the agent service on continuum
    vllm-continuum pause-demo          one tool-call pause, stock vLLM and continuum side by side
    vllm-continuum serve MODEL [...]   `vllm serve MODEL --scheduler-cls continuum ...`, CPU build too
    vllm-continuum cluster --instances N MODEL [...]   N continuum servers behind vllm-router
    vllm-continuum profile --url URL   measure prefill time vs context length (TTL model input)
    vllm-continuum tiny-model DIR      build the small random-weight test model

With the lab installed (the benchmarks and the simulator, a separate
distribution in the repository: `pip install ./lab`):

    vllm-continuum bench | compare | sim | matrix | overhead | workload | convert   the benchmarks
    vllm-continuum scale-bench [--quick]   one step's cost at scale, ours vs stock
    vllm-continuum tool-call-bench         reading a finished turn's tool call, new vs before
    vllm-continuum middleware-bench        the middleware adding hints, against parsing
    vllm-continuum calibrate --url URL --out FILE   a server's step time, as a simulator cost model
    vllm-continuum predict RUN_DIR --cost-model FILE   a compare run simulated beside what it measured
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

DEFAULT_MODEL_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "vllm-continuum/tiny-model"
)
# What a command may find missing, by the extra that brings it (pyproject.toml);
# a command names its extra as `needs` in its parser's defaults.
VLLM_MODULES = {"vllm", "torch", "transformers", "tokenizers"}  # [cpu] or [gpu]
EXTRA_MODULES = {"openai", "httpx", "tqdm", "fastapi", "uvicorn", "matplotlib", "numpy", "zmq"}
# Commands that load transformers or start vLLM: they first check that torchvision,
# torchaudio and torchcodec, if installed, load beside this torch (`serve` checks
# in vllm_continuum.adapter.launch, which cluster instances run too).
TORCH_COMMANDS = {"tiny-model", "demo", "pause-demo", "cluster"}
# The lab's commands join the parser when its module imports; without the lab,
# these names answer with how to install it.
LAB_MODULE = "continuum_lab.commands"
LAB_COMMANDS = ("bench", "compare", "workload", "convert", "sim", "matrix", "overhead",
                "fit-cost-model", "calibrate", "sizing", "predict", "scale-bench",
                "tool-call-bench", "middleware-bench")
LAB_INSTALL = "pip install ./lab (the lab/ folder of a clone of the vllm-continuum repository)"


def _tiny_model(args: argparse.Namespace) -> int:
    from vllm_continuum.tools.tiny_model import build_tiny_model

    print(build_tiny_model(args.dir, force=args.force))
    return 0


def _serve(args: argparse.Namespace, extra: list[str]) -> int:
    from vllm_continuum.adapter.launch import main as vllm_cli

    argv = ["serve", args.model, *([] if args.stock else ["--scheduler-cls", "continuum"]), *extra]
    print("+ vllm", " ".join(argv), flush=True)
    return vllm_cli(argv)


def _demo(args: argparse.Namespace) -> int:
    from vllm_continuum.demos.agent_demo import AgentDemoConfig, run_agent_demo

    sizes = {k: v for k, v in (("sessions", args.sessions), ("turns", args.turns)) if v}
    return run_agent_demo(model_dir=args.model_dir, out_dir=args.out, stock=args.stock,
                          config=AgentDemoConfig(**sizes))


def _pause_demo(args: argparse.Namespace) -> int:
    from vllm_continuum.demos.pause_demo import run_pause_demo

    return run_pause_demo(model_dir=args.model_dir, out_dir=args.out, flavours=args.flavours)


def _profile(args: argparse.Namespace) -> int:
    from vllm_continuum.tools.prefill_probe import run

    return run(args.url, args.out, args.lengths, args.repeats)


def _register_lab(sub) -> None:
    try:
        lab = importlib.import_module(LAB_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in ("continuum_lab", LAB_MODULE):
            raise
        for name in LAB_COMMANDS:
            sub.add_parser(name, add_help=False, help="(in the lab, not installed)").set_defaults(
                lab_missing=True)
        return
    before = set(sub.choices)
    lab.register(sub)
    for name in set(sub.choices) - before:
        sub.choices[name].set_defaults(needs="lab")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-continuum", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tiny-model", help="write the small HF-format test model to DIR")
    p.add_argument("dir", type=Path)
    p.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    p.set_defaults(run=_tiny_model)

    p = sub.add_parser(
        "serve",
        help="`vllm serve MODEL --scheduler-cls continuum`; other flags go to vLLM",
        description="Runs vLLM's own CLI, also on the CPU build, whose `vllm` console "
        "script is broken (so --api-server-count works there too).",
    )
    p.add_argument("model")
    p.add_argument("--stock", action="store_true", help="stock vLLM scheduler (for A/B runs)")
    p.set_defaults(run=_serve)

    p = sub.add_parser("demo", help="agent sessions through the agent service (main demo)")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--out", type=Path, default=Path("runs/agent-demo"), help="logs go here")
    p.add_argument("--stock", action="store_true", help="run on stock vLLM, for comparison")
    p.add_argument("--sessions", type=int, help="concurrent agent sessions (default 4)")
    p.add_argument("--turns", type=int, help="user turns per session (default 2)")
    p.set_defaults(run=_demo, needs="demo")

    p = sub.add_parser("pause-demo", help="one tool-call pause on stock vLLM and on continuum")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="server logs go here")
    p.add_argument("--flavours", nargs="+", choices=["stock", "continuum"],
                   default=["stock", "continuum"])
    p.set_defaults(run=_pause_demo, needs="demo")

    p = sub.add_parser("profile", help="measure prefill time against context length on a server")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the vLLM server")
    p.add_argument("--out", type=Path, default=Path("prefill_profile.yaml"))
    p.add_argument("--lengths", type=int, nargs="+", help="context lengths (default: doubling)")
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(run=_profile, needs="bench")

    from vllm_continuum.cluster.command import register as register_cluster

    register_cluster(sub)

    _register_lab(sub)

    args, extra = parser.parse_known_args(argv)
    if getattr(args, "lab_missing", False):
        raise SystemExit(f"vllm-continuum {args.command} is a command of the lab (benchmarks, "
                         f"simulator), which is not installed: {LAB_INSTALL}")
    if extra and args.command not in ("serve", "cluster"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in TORCH_COMMANDS:
        from vllm_continuum.adapter.launch import check_torch_extensions

        check_torch_extensions()
    try:
        if args.command in ("serve", "cluster"):
            return args.run(args, extra)
        return args.run(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in VLLM_MODULES:
            hint = "pip install 'vllm-continuum[gpu]' (or [cpu] on a CPU machine)"
        elif missing in EXTRA_MODULES and getattr(args, "needs", None) == "lab":
            hint = f"the lab's dependencies come with it: {LAB_INSTALL}"
        elif missing in EXTRA_MODULES and getattr(args, "needs", None):
            hint = f"pip install 'vllm-continuum[{args.needs}]'"
        else:
            raise
        raise SystemExit(f"vllm-continuum {args.command} needs {missing}: {hint}") from exc


if __name__ == "__main__":
    raise SystemExit(main())
