"""The text the tiny model's tokenizer is trained on, generated from a seed.

What the model will see in tests and demos: English-ish prose, JSON, Python,
tool calls and tool schemas, chat turns. Trained on that, the BPE merges make
prompts of those kinds a realistic number of tokens long.
"""

from __future__ import annotations

import json
import random
from typing import Any

_WORDS = """
the of and to in is it you that he was for on are with as his they be at one
have this from or had by word but what some we can out other were all there
when up use your how said an each she which do their time if will way about
many then them write would like so these her long make thing see him two has
look more day could go come did number sound no most people my over know water
than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say
help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port
large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother
world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run while press close night real life few north open
weather forecast search query file path read write list result error value
status request response session tool call function argument user assistant
system message content model token cache block memory server client agent
temperature celsius fahrenheit unit location date today tomorrow price stock
order item quantity total account email send schedule meeting calendar event
""".split()

_KEYS = """id name type value count items data status error message result
query city unit path content text url limit offset page size enabled tags
created updated user email score price arguments description parameters
properties required enum""".split()

_IDENTS = """x y i n data result items value config request response client
session cache block token model path text buf node key acc total count""".split()


def _json_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth > 2 or kind < 0.25:
        return rng.choice(_WORDS)
    if kind < 0.45:
        return rng.randint(-50, 5000)
    if kind < 0.55:
        return round(rng.uniform(-100, 100), rng.randint(0, 3))
    if kind < 0.62:
        return rng.choice([True, False, None])
    if kind < 0.8:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(_KEYS): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!", ","])


def _code(rng: random.Random) -> str:
    fn = "_".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    a, b = rng.sample(_IDENTS, 2)
    lines = [f"def {fn}({a}, {b}={rng.randint(0, 9)}):"]
    for _ in range(rng.randint(1, 5)):
        c = rng.choice(_IDENTS)
        lines.append(
            rng.choice(
                [
                    f"    {c} = {a} + {b} * {rng.randint(1, 99)}",
                    f"    if {a} is None:\n        return {rng.choice(['None', '[]', '{}', '0'])}",
                    f"    for {c} in {b}:\n        {a}.append({c})",
                    f"    {c} = {json.dumps(_json_value(rng, 1))}",
                    f'    print(f"{{{a}}} {rng.choice(_WORDS)}")',
                    f"    return {{'{rng.choice(_KEYS)}': {a}, '{rng.choice(_KEYS)}': {b}}}",
                ]
            )
        )
    return "\n".join(lines) + "\n"


def _tool_schema_json(rng: random.Random) -> str:
    props = {
        k: rng.choice(
            [
                {"type": "string", "description": _sentence(rng)},
                {"type": "integer"},
                {"type": "string", "enum": rng.sample(_WORDS, 3)},
            ]
        )
        for k in rng.sample(_KEYS, rng.randint(1, 3))
    }
    fn = "_".join(rng.sample(_WORDS, 2))
    return json.dumps(
        {
            "type": "function",
            "function": {
                "name": fn,
                "description": _sentence(rng),
                "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
            },
        }
    )


def training_corpus(n_docs: int, seed: int) -> list[str]:
    """English-ish prose, JSON, code and chat turns. Special and tool tokens
    are left out: the trainer does not split them off, so they would leak
    into merges such as ``.<|``."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.35:
            docs.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 6))))
        elif kind < 0.6:
            indent = rng.choice([None, None, 2])
            docs.append(
                json.dumps(
                    _json_value(rng, 0)
                    if rng.random() < 0.3
                    else {k: _json_value(rng, 1) for k in rng.sample(_KEYS, 3)},
                    indent=indent,
                )
            )
        elif kind < 0.75:
            docs.append(_code(rng))
        elif kind < 0.85:
            args = {rng.choice(_KEYS): _json_value(rng, 2) for _ in range(rng.randint(1, 3))}
            name = "_".join(rng.sample(_WORDS, 2))
            docs.append(json.dumps({"name": name, "arguments": args}))
        elif kind < 0.92:
            docs.append(_tool_schema_json(rng))
        else:
            docs.append(f"user\n{_sentence(rng)}\nassistant\n{_sentence(rng)} {_sentence(rng)}\n")
    return docs
