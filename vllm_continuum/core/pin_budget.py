"""How much of the pool pins may hold: the session's quota and the pool's cap.

Two limits bound what a new pin keeps, each counted in distinct physical
blocks (a block two pins share counts once):

- `session_quota_cut`: one session's pins hold at most its quota
  (`max_session_pinned_fraction` of the pool). A pin that would pass it
  keeps only its first blocks, since its next turn hits them (prefix hashes
  chain from the start); pins of the same session whose context the new one
  holds are replaced, not counted. Models with several KV cache groups
  cannot be cut that way: all or nothing.
- `cap_victims`: all pins hold at most the cap (`max_pinned_fraction`).
  To fit a new pin, pins of programs that arrived *later* are released
  (program order: an earlier program's context is worth more to the batch,
  it is further along); if those cannot make room, the new pin is refused
  and nothing is released.

Both are open by default (0.95 and 1.0): program admission already keeps
the programs' working sets to what the pool holds, and the release rules,
not these caps, keep pins fair (docs/guarantees.md). They stay the
operator's tool beside untrusted sessions. Both cost O(the new pin's blocks
+ the pins they release), whatever else is pinned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from itertools import takewhile

from vllm_continuum.core.pin_table import Pin, PinTable
from vllm_continuum.core.pressure import pins_to_release


def session_quota_cut(pins: PinTable, session: str, block_ids: Sequence[int | None],
                      hashes: Sequence[Hashable], *, quota: int, hashes_per_block: int,
                      one_kv_group: bool, pool_size: int | None = None) -> tuple[list[Pin], int]:
    """(the session's pins the new one replaces, how many of its leading blocks it
    keeps) so that the session's pins stay within `quota` blocks. `block_ids`: the
    new pin's blocks' ids in order (None for a null block); `pool_size`: the
    pool's blocks, if known: a quota of them all is never passed (a session's
    distinct blocks are the pool's), so nothing is counted (the default, 1.0)."""
    kept = len(block_ids)
    if (pool_size is not None and quota >= pool_size
            or pins.session_count_with(session, ()) + kept <= quota):  # fits, however many it shares
        return pins.pins_subsumed_by(session, hashes[: kept * hashes_per_block]), kept
    while True:  # fewer kept blocks replace fewer pins: a few rounds at most
        replaced = pins.pins_subsumed_by(session, hashes[: kept * hashes_per_block])
        others = pins.session_count_with(session, (), without=replaced)
        new = [i for i, b in enumerate(block_ids[:kept])
               if b is not None and not pins.session_holds(session, b, without=replaced)]
        room = quota - others
        if len(new) <= room or kept == 0:
            return replaced, kept
        kept = new[room] if one_kv_group and room > 0 else 0


def cap_victims(pins: PinTable, ids: tuple[int, ...], replaced: list[Pin], arrival: float, *,
                cap: int) -> list[Pin] | None:
    """The pins of later programs to release so that a new pin of `ids`, of a program
    that arrived at `arrival`, fits under `cap` blocks (`replaced` gone); None if it
    cannot fit: then nothing is released."""
    if pins.num_pinned_blocks + len(ids) <= cap:  # fits, however many it shares: O(1)
        return []
    total = pins.count_with(ids, without=replaced)
    if total <= cap:
        return []
    candidates = (p for p in takewhile(lambda p: p.program_arrival > arrival, pins.release_order())
                  if p not in replaced)
    going = Counter(b for p in replaced for b in p.block_id_set)
    victims = pins_to_release(candidates, total - cap, lambda b: pins.refs(b) - going[b], keep=set(ids))
    return victims or None
