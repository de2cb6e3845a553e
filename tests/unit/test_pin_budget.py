"""The session's quota and the pool's cap (core/pin_budget.py), without vLLM:
block ids and hashes by hand."""

from __future__ import annotations

from vllm_continuum.core.pin_budget import cap_victims, session_quota_cut
from vllm_continuum.core.pin_table import Pin, PinTable


def pin(table: PinTable, session: str, rid: str, ids: tuple[int, ...], arrival: float = 0.0) -> Pin:
    p = Pin(session_id=session, request_id=rid, tool="t", blocks=list(ids), block_ids=ids,
            created_at=0.0, expires_at=100.0, program_arrival=arrival,
            hashes=tuple(f"h{b}" for b in ids))
    table.add(p)
    return p


def cut(table: PinTable, ids, quota: int, one_kv_group: bool = True):
    return session_quota_cut(table, "s", ids, tuple(f"h{b}" for b in ids if b is not None),
                             quota=quota, hashes_per_block=1, one_kv_group=one_kv_group)


def test_a_pin_past_the_session_quota_keeps_its_first_blocks():
    table = PinTable()
    pin(table, "s", "a", (1, 2))  # another context of the session: it stays, and counts
    assert cut(table, (3, 4, 5, 6), quota=4) == ([], 2)
    assert cut(table, (3, 4), quota=4) == ([], 2)  # fits whole
    assert cut(table, (3, 4, 5), quota=2) == ([], 0)  # no room left at all
    # A block the session's pins already hold costs nothing more: 3 and 1 and 4 fit.
    assert cut(table, (3, 1, 4, 5), quota=4) == ([], 3)


def test_a_pin_whose_context_it_holds_is_replaced_not_counted():
    table = PinTable()
    old = pin(table, "s", "a", (1, 2))
    assert cut(table, (1, 2, 7, 8), quota=4) == ([old], 4)
    pin(table, "other", "b", (9, 10, 11))  # another session's pins are not this quota's
    assert cut(table, (1, 2, 7, 8), quota=4) == ([old], 4)


def test_several_kv_groups_pin_all_or_nothing():
    table = PinTable()
    pin(table, "s", "a", (1, 2))
    assert cut(table, (3, 4, 5, 6), quota=4, one_kv_group=False) == ([], 0)
    assert cut(table, (3, 4), quota=4, one_kv_group=False) == ([], 2)


def test_null_blocks_keep_their_places_and_cost_nothing():
    table = PinTable()
    pin(table, "s", "a", (1, 2))
    # (None, 3, 4, 5): room for 2 new blocks, the first two non-null -> keep 3 places
    assert session_quota_cut(table, "s", (None, 3, 4, 5), ("x", "h3", "h4", "h5"), quota=4,
                             hashes_per_block=1, one_kv_group=True) == ([], 3)


def test_the_cap_releases_later_programs_only_and_nothing_for_nothing():
    table = PinTable()
    early = pin(table, "e", "a", (1, 2), arrival=1.0)
    late = pin(table, "l", "b", (3, 4), arrival=5.0)
    assert cap_victims(table, (5, 6), [], arrival=2.0, cap=6) == []  # fits
    assert cap_victims(table, (5, 6), [], arrival=2.0, cap=4) == [late]
    # Only the earlier program could make room: refused, nothing released.
    assert cap_victims(table, (5, 6), [], arrival=9.0, cap=4) is None
    # A pin the new one replaces is gone already: it frees its blocks.
    assert cap_victims(table, (1, 2, 5, 6), [early], arrival=1.0, cap=6) == []
    assert early in table and late in table  # the functions decide; they release nothing
