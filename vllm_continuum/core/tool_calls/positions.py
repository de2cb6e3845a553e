"""Where in a finished output to look, at C speed where it can be: calls end a
turn (a marker is looked for in the last `TAIL` tokens first), a forced call
made under guided decoding starts it (`HEAD`)."""

from __future__ import annotations

TAIL = 512  # tokens at an output's end where a call's markers are looked for first
HEAD = 64  # and at its start, for a spelled marker (a forced call)


def near_end(output: list[int], token_id: int) -> int:
    """A position of `token_id` (which the output holds): its first in the
    last `TAIL` tokens, else its first (C-speed scans)."""
    try:
        return output.index(token_id, max(0, len(output) - TAIL))
    except ValueError:
        return output.index(token_id)


def last_index(output: list[int], token_id: int, before: int) -> int:
    """The last position of `token_id` before `before`, else -1 (a C-speed scan)."""
    if before <= 0:
        return -1
    try:
        return before - 1 - output[before - 1::-1].index(token_id)
    except ValueError:
        return -1


def positions(output: list[int], wanted: set[int]):
    """Positions of `wanted` tokens in the output's first `HEAD` and last
    `TAIL` tokens, in order: bounded, and a region none of them is in is
    passed at C speed."""
    n = len(output)
    for begin, end in ((0, min(HEAD, n)), (max(HEAD, n - TAIL), n)):
        if begin < end and not wanted.isdisjoint(output[begin:end]):
            for p in range(begin, end):
                if output[p] in wanted:
                    yield p
