"""A replayed turn's request body under `--hints all` and `--hints none`
(continuum_lab/live/turn_body.py), and the replay client sending them."""

from __future__ import annotations

import argparse
import re

import pytest

from continuum_lab.live.flavours import continuum_settings_arg
from continuum_lab.live.turn_body import ToolCallText, turn_body
from continuum_lab.trace_format import Program, Trace, Turn

CALL = ToolCallText("run_tests", *ToolCallText.texts("run_tests"),
                    head_ids=(900, 11, 12, 13, 14), tail_ids=(15, 901))


def test_with_hints_a_turn_carries_its_session_hints_and_fixed_length():
    body = turn_body("m", [1, 2], Turn(5, 12, "grep", 1.0), session="s")
    assert body["session_id"] == "s" and body["vllm_xargs"] == {"continuum_tool": "grep"}
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (12, 12, True)
    assert "structured_outputs" not in body and "logit_bias" not in body
    last = turn_body("m", [1, 2], Turn(5, 3), session="s")
    assert last["vllm_xargs"] == {"continuum_last_turn": 1}


def test_without_hints_a_tool_turn_has_the_engine_write_the_call():
    """No continuum key anywhere; the grammar admits exactly the call with the trace's
    tool name, padded by digits to the trace's length: 40 output tokens = 5 head ids
    + 2 tail ids + the end-of-sequence token + 32 digits."""
    body = turn_body("m", [1, 2], Turn(5, 40, "run_tests", 1.0), session="s", hints="none",
                     call=CALL, call_token_id=900)
    assert body["session_id"] == "s"
    assert not any("continuum" in key for key in body) and "ignore_eos" not in body
    regex = body["structured_outputs"]["regex"]
    call = '<tool_call>{"name": "run_tests", "arguments": {"n": "' + "7" * 32 + '"}}</tool_call>'
    assert re.fullmatch(regex, call)
    assert not re.fullmatch(regex, call.replace("7" * 32, "7" * 31))
    assert not re.fullmatch(regex, call.replace("run_tests", "search"))
    assert body["logit_bias"] == {str(i): 100.0 for i in (900, 11, 12, 13, 14, 15, 901)}
    assert body["max_tokens"] >= 40


def test_without_hints_a_short_turn_is_the_call_alone():
    """A trace output shorter than the call: no digits, the call is the floor."""
    body = turn_body("m", [1], Turn(5, 3, "run_tests", 1.0), session="s", hints="none",
                     call=CALL, call_token_id=900)
    assert re.fullmatch(body["structured_outputs"]["regex"],
                        '<tool_call>{"name": "run_tests", "arguments": {"n": ""}}</tool_call>')


def test_without_hints_a_turn_without_a_tool_is_text_that_cannot_call_one():
    body = turn_body("m", [1], Turn(5, 9), session="s", hints="none", call_token_id=900)
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (9, 9, True)
    assert body["logit_bias"] == {"900": -100.0} and "vllm_xargs" not in body
    assert "structured_outputs" not in body


@pytest.mark.parametrize("hints", ["all", "none"])
def test_a_one_shot_request_is_the_same_under_either_mode(hints):
    body = turn_body("m", [1], Turn(5, 9), session=None, hints=hints, call_token_id=900)
    assert body == turn_body("m", [1], Turn(5, 9), session=None)
    assert "session_id" not in body and "vllm_xargs" not in body and "logit_bias" not in body


def test_missing_call_text_or_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="ToolCallText"):
        turn_body("m", [1], Turn(5, 9, "grep", 1.0), session="s", hints="none", call=CALL)
    with pytest.raises(ValueError, match="hints must be one of"):
        turn_body("m", [1], Turn(5, 9), session="s", hints="some")


def test_tool_names_are_json_and_regex_escaped():
    call = ToolCallText('a.b"c', *ToolCallText.texts('a.b"c'), head_ids=(1,), tail_ids=(2,))
    assert call.head.endswith('"name": "a.b\\"c", "arguments": {"n": "')
    assert re.fullmatch(call.regex(2), call.head + "12" + call.tail)
    assert not re.fullmatch(call.regex(2), call.head.replace("a.b", "axb") + "12" + call.tail)


def test_replay_without_hints_tokenizes_each_tool_once_and_sends_no_hint(monkeypatch):
    """The replay client asks the server's tokenizer for each tool's call text
    before it starts, then sends bodies without any continuum hint."""
    from continuum_lab.live import replay as replay_mod

    bodies, tokenized = [], []

    async def served_model(client):
        return "m"

    async def token_ids(client, model, text):
        tokenized.append(text)
        return (900,) if text == "<tool_call>" else (1, 2, 3)

    async def send_turn(client, body, started):
        bodies.append(body)
        return 0.01, 0.02, [7] * 4, {"prompt_tokens": len(body["prompt"])}

    monkeypatch.setattr(replay_mod, "_served_model", served_model)
    monkeypatch.setattr(replay_mod, "_token_ids", token_ids)
    monkeypatch.setattr(replay_mod, "_send_turn", send_turn)
    trace = Trace([Program("a", 0.0, (Turn(30, 20, "grep", 0.0), Turn(5, 20, "grep", 0.0),
                                      Turn(5, 1))),
                   Program("c", 0.0, (Turn(40, 3),), one_shot=True)])
    run = replay_mod.replay("http://unused", trace, progress=False, hints="none")
    assert run.meta["hints"] == "none" and not run.errors
    assert tokenized.count("<tool_call>") == 1 and len(tokenized) == 3  # the token, grep's head, tail
    assert not any("vllm_xargs" in b for b in bodies)
    assert sum("structured_outputs" in b for b in bodies) == 2


def test_continuum_settings_are_checked_against_the_config():
    assert continuum_settings_arg('{"pin_cost": "pressure"}') == {"pin_cost": "pressure"}
    for bad, message in [('{"pin_cost": "sometimes"}', "invalid continuum settings"),
                         ('{"no_such_setting": 1}', "no_such_setting"),
                         ('["pin_cost"]', "not a JSON object"),
                         ("{pin_cost: pressure}", "not JSON")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            continuum_settings_arg(bad)


def test_every_compare_flavour_is_a_valid_config_and_the_queue_order_one_differs_only_there():
    from vllm_continuum.config import load_config
    from continuum_lab.live.flavours import FLAVOURS

    configs = {name: load_config(use_env=False, **f.settings)
               for name, f in FLAVOURS.items() if f.server == "continuum"}
    shipped, paper_order = configs["continuum"], configs["continuum-program-fcfs"]
    assert shipped.queue_order != "program_fcfs"  # else the flavour measures nothing
    assert paper_order.queue_order == "program_fcfs"
    assert paper_order.model_copy(update={"queue_order": shipped.queue_order}) == shipped
