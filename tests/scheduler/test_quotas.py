"""Quotas against hogging (scheduler level): 50 sessions pin with the largest
TTL hint they can send, then newcomers arrive. Each step of the synthetic
engine advances the clock by 0.5 s, so TTLs run out in steps."""

from __future__ import annotations

import statistics


from tests.scheduler.harness import EOS_TOKEN_ID, FakeClock, audit, make_request, make_scheduler, tokens
from vllm_continuum.config import ContinuumConfig

POOL = 128
STEP_S = 0.5
MAX_TTL_S = 20.0


def run(model_dir, flavour: str) -> dict:
    settings = {"ttl_policy": "fixed", "max_ttl_s": MAX_TTL_S, "pressure_policy": flavour}
    s = make_scheduler(model_dir, num_blocks=POOL, continuum=flavour != "stock",
                       max_num_seqs=64, max_num_batched_tokens=4096, settings=settings)
    clock = FakeClock()
    if flavour != "stock":
        s.continuum.clock = clock
    vocab = s.structured_output_manager.tokenizer.get_vocab()
    scripts: dict[str, list[int]] = {}
    admitted: dict[str, int] = {}
    step_no = 0
    worst_pinned = 0
    oldest_pin_age = 0.0

    def step():
        nonlocal step_no, worst_pinned, oldest_pin_age
        from vllm.v1.outputs import ModelRunnerOutput

        out = s.schedule()
        step_no += 1
        clock.advance(STEP_S)
        for new in out.scheduled_new_reqs:
            admitted.setdefault(new.req_id, step_no)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in ids:
            r = s.requests[req_id]
            script = scripts.get(req_id)
            done = r.num_computed_tokens >= r.num_tokens
            sampled.append([script.pop(0) if script else 7] if done else [])
        s.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled))
        if flavour != "stock":
            audit(s)
            worst_pinned = max(worst_pinned, s.continuum.pins.num_pinned_blocks)
            for pin in s.continuum.pins:
                oldest_pin_age = max(oldest_pin_age, clock.now - pin.created_at)

    hogs = [make_request(tokens(100 + i, 40), session=f"hog-{i}", max_tokens=4,
                         xargs={"continuum_ttl_s": 1e9, "continuum_tool": "sleep"})
            for i in range(50)]
    for r in hogs:
        scripts[r.request_id] = [vocab["<tool_call>"], EOS_TOKEN_ID]
        s.add_request(r)
    while any(not r.is_finished() for r in hogs):
        step()
    arrival_step = step_no
    newcomers = [make_request(tokens(9000 + i, 300), max_tokens=8) for i in range(12)]
    for r in newcomers:
        s.add_request(r)
    for _ in range(400):
        if all(r.is_finished() for r in newcomers):
            break
        step()
    assert all(r.is_finished() for r in newcomers), f"{flavour}: a newcomer never completed"
    waits = [admitted[r.request_id] - arrival_step for r in newcomers]
    return {
        "waits": waits,
        "mean_wait_steps": statistics.mean(waits),
        "pinned_peak": worst_pinned,
        "oldest_pin_age_s": oldest_pin_age,
        "pins": sum(s.continuum.stats.pins_by_tool.values()) if flavour != "stock" else 0,
    }


def test_hogging_sessions_stay_within_quotas(tiny_model_dir, capsys):
    results = {f: run(tiny_model_dir, f) for f in ("stock", "yield", "hold")}
    cap = int(ContinuumConfig().max_pinned_fraction * (POOL - 1))  # the default cap
    for flavour in ("yield", "hold"):
        r = results[flavour]
        assert 0 < r["pinned_peak"] <= cap
        assert r["oldest_pin_age_s"] <= MAX_TTL_S + STEP_S  # released at the first step past it
        assert r["pins"] > 0
    # yield: newcomers are admitted exactly when stock vLLM admits them
    assert results["yield"]["waits"] == results["stock"]["waits"]
    # hold: newcomers may queue behind running work, never past the pins' TTL
    assert max(results["hold"]["waits"]) * STEP_S <= MAX_TTL_S + 60
    with capsys.disabled():
        print("\nnewcomers' queueing behind 50 hogging sessions (steps of the synthetic engine):")
        for flavour, r in results.items():
            extra = r["mean_wait_steps"] - results["stock"]["mean_wait_steps"]
            print(f"  {flavour:>5}: mean wait {r['mean_wait_steps']:.1f} steps "
                  f"(+{extra:.1f} vs stock), pinned peak {r['pinned_peak']} blocks")
