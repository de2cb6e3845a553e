"""A lost pin priced by the tier that would serve its next turn (core/lost_pin.py),
the retention rules that read that price, and which pins are reloadable
(core/reloadable.py)."""

from __future__ import annotations

import pytest

from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from vllm_continuum.core.lost_pin import NOTHING_HELD, Held, held_by, lost_pin_s, resume_source
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.reloadable import MIN_SAMPLES, RELOAD_SHARE, Reloadable
from vllm_continuum.core.ttl import ContinuumTTLPolicy, TurnEnd
from vllm_continuum.core.workload import WorkloadModel

# 1 ms a token, plus 1 us per token squared / 1000: t(70k) = 70 + 4.9 s.
PROFILE = PrefillProfile(c0=0.0, c1=1e-3, c2=1e-9)


class Tier:
    """A host tier holding the first `holds` tokens of any context, loading 1M tokens/s."""

    def __init__(self, holds: int) -> None:
        self.holds = holds
        self.asked: list[tuple[int, int]] = []

    def held_tokens(self, hashes, num_tokens: int) -> int:
        self.asked.append((len(hashes), num_tokens))
        return self.holds

    def reload_s(self, num_tokens: int) -> float:
        return num_tokens / 1e6

    def loaded_tokens(self, request_id: str) -> int:
        return 0


def test_without_a_host_tier_a_lost_pin_costs_its_prefill():
    assert lost_pin_s(PROFILE, 70_000) == PROFILE.seconds(70_000)
    assert held_by(None, ("h",), 70_000) == NOTHING_HELD


def test_what_the_host_tier_holds_is_reloaded_the_rest_prefilled():
    held = held_by(Tier(60_000), ("h",) * 10, 70_000)
    assert held == Held(60_000, 0.06)
    expected = 0.06 + PROFILE.seconds(70_000) - PROFILE.seconds(60_000)
    assert lost_pin_s(PROFILE, 70_000, held) == pytest.approx(expected)
    assert lost_pin_s(PROFILE, 70_000, held) < PROFILE.seconds(70_000) / 5
    # A tier claiming more than the context holds the context, no more.
    assert held_by(Tier(10**9), ("h",), 100).tokens == 100
    assert held_by(Tier(0), ("h",), 100) == NOTHING_HELD


@pytest.mark.parametrize("had_pin, loaded, cached, source", [
    (True, 0, 500, "pinned"), (True, 100, 500, "pinned"), (False, 100, 500, "host_tier"),
    (False, 0, 500, "gpu_cache"), (False, 0, 0, "recomputed")])
def test_resume_source(had_pin, loaded, cached, source):
    assert resume_source(had_pin, loaded, cached) == source


def test_the_retention_rules_read_the_price():
    workload = WorkloadModel(history_limit=100, queueing_window=16, program_window=16)
    hazard = HazardTTLPolicy(workload, PROFILE, 30.0)
    held = Held(60_000, 0.06)
    assert hazard.benefit_s(70_000) == pytest.approx(PROFILE.seconds(70_000))
    assert hazard.benefit_s(70_000, held) == pytest.approx(lost_pin_s(PROFILE, 70_000, held))
    eq2 = ContinuumTTLPolicy(workload, PROFILE, cold_start_samples=5, max_ttl_s=30.0)
    cold, warm = TurnEnd("s", "t", 70_000), TurnEnd("s", "t", 70_000, held=held)
    assert eq2.benefit_s(warm, eta=1.0) == pytest.approx(lost_pin_s(PROFILE, 70_000, held))
    # Eq. 2 at a cold start holds for ln(B): a cheap loss is held for less.
    assert eq2.decide(warm).ttl_s < eq2.decide(cold).ttl_s


def test_a_contested_pin_whose_loss_is_cheap_is_let_go_sooner():
    """Under contention memory has a price: a context the host tier holds
    is worth less memory-time than one its next turn would prefill."""
    workload = WorkloadModel(history_limit=100, queueing_window=16, program_window=16)
    workload.blocks_short(0.0)
    workload.tools.track_running_calls(30.5, forget_after_s=600.0, max_calls=100)
    for d in (1.0, 5.0, 10.0, 20.0):
        workload.tool_returned(None, "s0", "t", d)
    hazard = HazardTTLPolicy(workload, PROFILE, 30.0, idle_cost=0.02, revisit_s=1e9)
    full = hazard.choose(TurnEnd("s", "t", 20_000)).ttl_s
    cheap = hazard.choose(TurnEnd("s", "t", 20_000, held=Held(19_900, 0.02))).ttl_s
    assert full == 20.0 and cheap < full


# --- reloadable pins (core/reloadable.py) ---------------------------------------------------


def test_a_pin_is_reloadable_when_losing_it_costs_a_reload_not_a_prefill():
    rule = Reloadable(PROFILE)
    full = PROFILE.seconds(70_000)
    assert rule.priced(70_000, Held(70_000, 0.07))
    assert rule.priced(70_000, Held(69_000, 0.069))  # the outputs recomputed: cheap still
    # Half of it held: the other half's prefill costs more than a quarter of the whole.
    half = Held(35_000, 0.035)
    assert lost_pin_s(PROFILE, 70_000, half) > RELOAD_SHARE * full and not rule.priced(70_000, half)
    assert not rule.priced(70_000, NOTHING_HELD)
    # A slow link: the reload itself costs more than a quarter of the prefill.
    assert not rule.priced(70_000, Held(70_000, full / 2))


def test_the_tier_is_trusted_only_after_it_served_lost_pins_back():
    rule = Reloadable(PROFILE, window=32)
    held = Held(70_000, 0.07)
    for _ in range(MIN_SAMPLES - 1):
        rule.resumed(None, 1000, 1000)
    assert not rule.gives_way(None, 70_000, held)  # too few to go by
    rule.resumed(None, 1000, 950)
    served = rule.served(None)
    lost = served.lost
    assert served.trusted and lost.share == pytest.approx((15_000 + 950) / 16_000)
    assert rule.gives_way(None, 70_000, held) and not rule.gives_way(None, 70_000, NOTHING_HELD)
    # Contexts that come back recomputed (a tier too small for the traffic) switch it off...
    for _ in range(16):
        rule.resumed(None, 1000, 100)
    assert lost.share == pytest.approx((15_950 + 1_600) / 32_000) and not served.trusted
    # ...and the window forgets the old ones: only the last 32 count.
    for _ in range(32):
        rule.resumed(None, 1000, 1000)
    assert lost.share == 1.0 and served.trusted
    rule.resumed(None, 0, 0)  # nothing to judge by: ignored
    rule.resumed(None, 10, 50)  # a claim past the prompt counts as the prompt
    assert lost.share == 1.0


def test_hand_overs_judge_the_tier_until_lost_pins_can():
    """A pin handed to its next turn tells what the host tier still held of
    its context: what that turn would have loaded had the pin been lost.
    Where pins are seldom lost that is the only evidence; once enough lost
    pins have resumed, theirs has the last word (a hand-over does not see
    the queue a lost pin's next turn waits in)."""
    rule = Reloadable(PROFILE, window=32)
    held = Held(70_000, 0.07)
    for _ in range(MIN_SAMPLES):
        rule.resumed(None, 1000, 900, pinned=True)
    served = rule.served(None)
    assert served.kept.share == pytest.approx(0.9) and served.trusted
    assert rule.gives_way(None, 70_000, held)
    for _ in range(MIN_SAMPLES - 1):  # lost pins came back half computed: not yet enough to judge
        rule.resumed(None, 1000, 500)
    assert served.trusted
    rule.resumed(None, 1000, 500)
    assert not served.trusted and not rule.gives_way(None, 70_000, held)
    for _ in range(MIN_SAMPLES):  # hand-overs cannot outvote them
        rule.resumed(None, 1000, 1000, pinned=True)
    assert not served.trusted


def test_one_tenants_resumes_make_no_other_tenants_pins_give_way():
    """The share is kept per tenant (cache_salt) and a pin reads its own; a
    flood of salts forgets the least recent salted tenants, whose pins are
    then kept (no evidence), never given up."""
    rule = Reloadable(PROFILE, max_tenants=2)
    held = Held(70_000, 0.07)
    for _ in range(MIN_SAMPLES):
        rule.resumed("a", 1000, 1000)
    assert rule.gives_way("a", 70_000, held)
    assert not rule.gives_way(None, 70_000, held) and not rule.gives_way("b", 70_000, held)
    for salt in ("b", "c"):  # a third salted tenant: "a", the least recent, is forgotten
        rule.resumed(salt, 1000, 1000)
    assert rule.served("a") is None and not rule.gives_way("a", 70_000, held)


def test_hand_overs_are_not_read_once_lost_pins_are_judged():
    rule = Reloadable(PROFILE, window=32)
    assert rule.reads_hand_overs(None) and rule.reads_hand_overs("unseen")
    for _ in range(MIN_SAMPLES):
        rule.resumed(None, 1000, 500)
    assert not rule.reads_hand_overs(None)  # the host lookup is skipped from now on
