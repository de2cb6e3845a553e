"""Which probes `calibrate` runs: the grid of what a step can hold on this server.

- cold prefills of doubling lengths up to the context window (`profile`'s
  lengths, tools/prefill_probe.py, after a 16-token one for the overhead);
  past max_num_batched_tokens they run in chunks, so the chunking is measured;
- prefills on top of a cached prefix of a quarter and a half of the window
  (a resumed agent turn), so that attention to cached tokens is measured;
- decode steps of B streams, each at its own context C, for the (B, C) the
  pool and max_num_seqs allow, and the same under a grammar at the shortest
  context.

Each point runs `repeats` times; `measure` (command.py) shuffles them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from continuum_lab.calibration.probes import DECODE_TAIL, GUIDED
from continuum_lab.calibration.server import ServerShape
from vllm_continuum.tools.prefill_probe import WINDOW_MARGIN, default_lengths

# New tokens of a prefill on a cached prefix: a resumed turn's share (a tool result).
EXTENDED_PREFILL = 512


class Probe(NamedTuple):
    kind: str  # "prefill", "decode" or GUIDED
    args: tuple[int, int]  # prefill: (new tokens, cached); decode: (batch, context)


def decode_fits(shape: ServerShape, batch: int, context: int, tokens: int) -> bool:
    """Whether B streams at context C fit the pool: each stream's prefix and its own
    blocks after it, one block of slack. A batch the pool cannot hold is one the
    engine never runs."""
    bs = shape.block_size
    per_stream = context // bs + -(-(DECODE_TAIL + tokens) // bs) + 1
    return (batch <= shape.max_num_seqs and context + DECODE_TAIL + tokens <= shape.max_model_len
            and batch * per_stream + 1 <= shape.num_gpu_blocks - 1)


def plan(shape: ServerShape, *, lengths: Sequence[int] | None, batches: Sequence[int],
         contexts: Sequence[int] | None, repeats: int, decode_tokens: int,
         guided: bool = True) -> tuple[list[Probe], list[str]]:
    """The probes to run, and the (B, C) left out and why."""
    top = shape.max_model_len - WINDOW_MARGIN
    lengths = list(lengths or [16, *default_lengths(shape.max_model_len)])
    contexts = sorted(contexts or {128, top // 4, top // 2, top - decode_tokens - DECODE_TAIL})
    probes = [Probe("prefill", (n, 0)) for n in lengths for _ in range(repeats)]
    for cached in sorted({top // 4, top // 2}):
        probes += [Probe("prefill", (min(EXTENDED_PREFILL, top - cached), cached))] * repeats
    skipped = []
    for b in batches:
        for c in contexts:
            if not decode_fits(shape, b, c, decode_tokens):
                skipped.append(f"decode B={b} C={c}: beyond the pool ({shape.num_gpu_blocks} blocks), "
                               f"max_num_seqs or max_model_len")
                continue
            probes += [Probe("decode", (b, c))] * repeats
            if guided and c == contexts[0]:  # the grammar's cost beside the free decode
                probes += [Probe(GUIDED, (b, c))] * repeats
    return probes, skipped
