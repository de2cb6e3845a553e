"""Build a directory beside its target and move it in whole, so that a crash or a
concurrent build never leaves a half-written model directory behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing_dir(target: Path, *, is_complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield an empty directory next to `target`; when the block succeeds it
    replaces `target`. `is_complete`: a check that a concurrent build already
    put a good `target` in place, which is then kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        yield tmp
        if target.exists():
            if is_complete is not None and is_complete(target):
                return
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if is_complete is None or not is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
