"""Tool-call formats for tiny models and tests: each family's tokens, and one
call of `get_weather({"city": "Paris"})` and one plain answer, written exactly
as that family's models write them (vLLM's parsers' docstrings and regexes,
`vllm/tool_parsers/`, `vllm/parser/`; docs/how-it-works.md lists them).

`tokens` are the strings the family's real tokenizer holds as single tokens
(its call markers and the delimiters inside a call); `family_tokenizer`
gives the tiny tokenizer exactly those, so a test sees the ids a real model
of the family would emit. A family with no `tokens` writes its calls as text
(`parser` then names the vLLM parser the operator configures).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from vllm_continuum.tools.tiny_model.chat_template import KIMI_K2_TEMPLATE

TOOL = "get_weather"


@dataclass(frozen=True)
class Sample:
    parser: str  # vLLM's --tool-call-parser for it
    call: str  # a get_weather call, as the model writes it
    answer: str = "It is sunny in Paris today."  # a plain answer
    tokens: tuple[str, ...] = ()  # single tokens of its real tokenizer
    tool: str = TOOL  # the name the call holds
    format: str | None = None  # the format the scheduler reports (default: `parser`)
    needs_parser: bool = False  # a text format: recognised with `tool_call_parser` only
    stops: tuple[str, ...] = ()  # tokens its turns end with (else the end-of-sequence token)

    @property
    def shown_format(self) -> str:
        return self.format or self.parser


_HERMES = ("<tool_call>", "</tool_call>")
_GLM = (*_HERMES, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
_KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>")
_DEEPSEEK = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
             "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")
_HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>",
            "<|return|>")
_ARGS = '{"city": "Paris"}'
_JSON_CALL = f'{{"name": "{TOOL}", "arguments": {_ARGS}}}'
_XML_CALL = f"<function={TOOL}>\n<parameter=city>\nParis\n</parameter>\n</function>"

SAMPLES: dict[str, Sample] = {
    "hermes": Sample("hermes", f"<tool_call>\n{_JSON_CALL}\n</tool_call>", tokens=_HERMES),
    "qwen3_coder": Sample("qwen3_coder", f"<tool_call>\n{_XML_CALL}\n</tool_call>", tokens=_HERMES),
    "glm45": Sample("glm45", f"<tool_call>{TOOL}\n<arg_key>city</arg_key>\n<arg_value>Paris"
                    "</arg_value>\n</tool_call>", tokens=_GLM),
    "glm47": Sample("glm47", f"<tool_call>{TOOL}<arg_key>city</arg_key><arg_value>Paris"
                    "</arg_value></tool_call>", tokens=_GLM, format="glm45"),
    "kimi_k2": Sample("kimi_k2", f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{TOOL}:0"
                      f"<|tool_call_argument_begin|>{_ARGS}<|tool_call_end|><|tool_calls_section_end|>",
                      tokens=_KIMI),
    "deepseek_v3": Sample("deepseek_v3", f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                          f"{TOOL}\n```json\n{_ARGS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                          tokens=_DEEPSEEK),
    "deepseek_v31": Sample("deepseek_v31", f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{TOOL}<｜tool▁sep｜>"
                           f"{_ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", tokens=_DEEPSEEK),
    "deepseek_v32": Sample("deepseek_v32", f'<｜DSML｜function_calls>\n<｜DSML｜invoke name="{TOOL}">\n'
                           '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                           "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
                           tokens=("<｜DSML｜function_calls>", "</｜DSML｜function_calls>")),
    "deepseek_v32_text": Sample("deepseek_v32", f'<｜DSML｜function_calls>\n<｜DSML｜invoke name="{TOOL}">'
                                "\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", needs_parser=True),
    "minimax_m2": Sample("minimax_m2", f'<minimax:tool_call>\n<invoke name="{TOOL}">\n<parameter '
                         'name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>',
                         tokens=("<minimax:tool_call>", "</minimax:tool_call>")),
    "mistral": Sample("mistral", f"[TOOL_CALLS][{_JSON_CALL}]", tokens=("[TOOL_CALLS]",)),
    "mistral_v11": Sample("mistral", f"[TOOL_CALLS]{TOOL}[ARGS]{_ARGS}", tokens=("[TOOL_CALLS]", "[ARGS]")),
    "openai": Sample("openai", "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
                     f"<|start|>assistant<|channel|>commentary to=functions.{TOOL} <|constrain|>json"
                     f"<|message|>{_ARGS}<|call|>",
                     answer="<|channel|>final<|message|>It is sunny in Paris today.<|return|>",
                     tokens=_HARMONY, stops=("<|call|>", "<|return|>")),
    "llama3_python_tag": Sample("llama3_json", f'<|python_tag|>{{"name": "{TOOL}", "parameters": '
                                f"{_ARGS}}}<|eom_id|>", tokens=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>"),
                                stops=("<|eom_id|>", "<|eot_id|>")),
    # A built-in tool (Llama 3.1 with "Environment: ipython"): vLLM returns it as
    # content; the client's executor runs it and comes back, as after any call.
    "llama3_builtin": Sample("llama3_json", '<|python_tag|>brave_search.call(query="Paris weather")'
                             "<|eom_id|>", tokens=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>"),
                             tool="brave_search", stops=("<|eom_id|>", "<|eot_id|>")),
    "llama3_json": Sample("llama3_json", f'{{"name": "{TOOL}", "parameters": {_ARGS}}}',
                          tokens=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>"), needs_parser=True),
    "llama4_pythonic": Sample("llama4_pythonic", f'<|python_start|>[{TOOL}(city="Paris")]<|python_end|>',
                              tokens=("<|python_start|>", "<|python_end|>")),
    "pythonic": Sample("pythonic", f'[{TOOL}(city="Paris")]', needs_parser=True),
    "olmo3": Sample("olmo3", f'<function_calls>\n{TOOL}(city="Paris")\n</function_calls>',
                    needs_parser=True),
    "gemma4": Sample("gemma4", f'<|tool_call>call:{TOOL}{{city:<|"|>Paris<|"|>}}<tool_call|>',
                     tokens=("<|tool_call>", "<tool_call|>", '<|"|>')),
    "seed_oss": Sample("seed_oss", f"<seed:tool_call>\n{_XML_CALL}\n</seed:tool_call>",
                       tokens=("<seed:tool_call>", "</seed:tool_call>")),
    "granite": Sample("granite", f"<|tool_call|>[{_JSON_CALL}]", tokens=("<|tool_call|>",)),
    "granite_text": Sample("granite", f"<tool_call>[{_JSON_CALL}]", format="hermes", needs_parser=True),
    "granite-20b-fc": Sample("granite-20b-fc", f"<function_call> {_JSON_CALL}",
                             tokens=("<function_call>",)),
    "functiongemma": Sample("functiongemma", f"<start_function_call>call:{TOOL}{{city:<escape>Paris"
                            "<escape>}<end_function_call>",
                            tokens=("<start_function_call>", "<end_function_call>", "<escape>")),
    "xlam": Sample("xlam", f"[{_JSON_CALL}]", needs_parser=True),
}


# Families a tiny model can be served as (build_tiny_model(family=...)): the
# tokens its tokenizer holds (special, as in the real one) and its chat template.
SERVED: dict[str, tuple[tuple[str, ...], str]] = {
    "kimi_k2": ((*_KIMI, "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                 "<think>", "</think>"), KIMI_K2_TEMPLATE),
}


def sample_tokenizer(base: str | pathlib.Path, key: str, out: str | pathlib.Path) -> pathlib.Path:
    """`family_tokenizer` for `SAMPLES[key]`: its tokens, and none of the tiny
    model's own Hermes tokens it does not use."""
    from vllm_continuum.tools.tiny_model.tokenizer import TOOL_TOKENS

    tokens = SAMPLES[key].tokens
    return family_tokenizer(base, tokens, out, drop=tuple(t for t in TOOL_TOKENS if t not in tokens))


def family_tokenizer(base: str | pathlib.Path, tokens: tuple[str, ...], out: str | pathlib.Path,
                     *, drop: tuple[str, ...] = ()) -> pathlib.Path:
    """A copy of the tiny model's tokenizer (and config) at `out` with `tokens`
    added as single special tokens and the added tokens `drop` taken out (so a
    family without `<tool_call>` does not have it). No weights: enough for
    the scheduler, which reads the config and the tokenizer."""
    from tokenizers import AddedToken, Tokenizer

    base, out = pathlib.Path(base), pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads((base / "tokenizer.json").read_text())
    kept = [t for t in spec["added_tokens"] if t["content"] not in drop]
    kept_ids = {t["id"] for t in kept}
    gone = sorted(t["id"] for t in spec["added_tokens"] if t["id"] not in kept_ids)
    assert all(i > max(kept_ids | {0}) for i in gone), "only the last added tokens can be dropped"
    spec["added_tokens"] = kept
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in tokens if tokenizer.token_to_id(t) is None])
    tokenizer.save(str(out / "tokenizer.json"))
    for name in ("tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (base / name).exists():
            (out / name).write_text((base / name).read_text())
    config = json.loads((base / "config.json").read_text())
    config["vocab_size"] = max(config["vocab_size"], tokenizer.get_vocab_size())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
