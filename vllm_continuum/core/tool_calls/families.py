"""How the models agents are served with write a tool call, as vLLM's tool
parsers read it (`vllm/tool_parsers/`, `vllm/parser/`, 0.32 and 0.33).

Two kinds of format:

- **marker families** (`FAMILIES`): the call starts with a token of its own
  (`<tool_call>`, `<|tool_calls_section_begin|>`, `[TOOL_CALLS]`, ...) or the
  turn ends with one (gpt-oss's `<|call|>`). The real tokenizers hold these as
  single tokens, so the scheduler finds them by id with no setting; the
  tool's name is read from a few tokens after the marker (for an end token,
  from the last `look_back_to` token before it).
- **text formats** (`TEXT_FORMATS`): the call is plain text at the start of
  the message (Llama 3's JSON, pythonic lists). Only the operator knows the
  model writes them: `tool_call_parser` (vLLM's parser name) turns them on,
  anchored at the start of the output (or right after the reasoning).

`PARSERS` maps each vLLM `--tool-call-parser` name we read to what it
brings. A name is a label (it selects a duration history and a TTL), never
trusted: anything unreadable is `unknown`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"([^\"\\\s<>]{1,128})"
# A JSON call object at the start of the text (after `[` for a list): its
# "name" within the object's first keys (`{"type": "function", "name": ...`).
JSON_NAME = re.compile(r'\A\s*(?:```(?:json)?\s*)?\[?\s*\{[^{}]{0,64}?"name"\s*:\s*"' + r'([^"\\]{1,128})"')
FUNCTION_TAG = re.compile(r"\A\s*<function=" + _NAME + ">")


@dataclass(frozen=True)
class NameReader:
    pattern: re.Pattern  # searched in the text after the marker; group 1 is the name
    format: str  # the format a match shows (several formats share `<tool_call>`)


@dataclass(frozen=True)
class Family:
    name: str  # the format's label: vLLM's `--tool-call-parser` name for it
    starts: tuple[str, ...] = ()  # tokens that open a call
    names: tuple[NameReader, ...] = ()
    name_after: str | None = None  # the start token the name follows (else the first start found)
    ends: tuple[str, ...] = ()  # tokens that end a turn in a call
    look_back_to: tuple[str, ...] = ()  # an end token's name is read from the last of these before it
    first_only: bool = False  # a start token counts only as the output's first token

    @property
    def markers(self) -> tuple[str, ...]:
        return self.starts + self.ends


def _reader(pattern: str, fmt: str) -> NameReader:
    return NameReader(re.compile(pattern), fmt)


def _json(fmt: str) -> NameReader:
    return NameReader(JSON_NAME, fmt)


FAMILIES: tuple[Family, ...] = (
    # Qwen2.5/Qwen3 (hermes), Qwen3-Coder (<function=NAME>), GLM-4.5/4.6/4.7 (the
    # bare name, then <arg_key> or a line break), Ernie 4.5, Granite 4: one marker.
    Family("hermes", starts=("<tool_call>",), names=(
        NameReader(FUNCTION_TAG, "qwen3_coder"),
        _json("hermes"),
        _reader(r"\A\s*([A-Za-z_][\w.\-]{0,127})\s*(?:<|\n|\Z)", "glm45"),
    )),
    # <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}
    Family("kimi_k2", starts=("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
           name_after="<|tool_call_begin|>",
           names=(_reader(r"\A\s*(?:functions\.)?([^\s:<>]{1,128})", "kimi_k2"),)),
    # V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json...; V3.1: ...begin｜>NAME<｜tool▁sep｜>{...}
    Family("deepseek_v3", starts=("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
           name_after="<｜tool▁call▁begin｜>", names=(
               _reader(r"\A\s*function\s*<｜tool▁sep｜>\s*([^\s<>`]{1,128})", "deepseek_v3"),
               _reader(r"\A\s*([^\s<>]{1,128}?)\s*<｜tool▁sep｜>", "deepseek_v31"),
           )),
    # DeepSeek V3.2 <｜DSML｜function_calls>, V4 <｜DSML｜tool_calls>, then <｜DSML｜invoke name="NAME">
    Family("deepseek_v32", starts=("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"),
           names=(_reader(r'<｜DSML｜\s?invoke\s+name="([^"]{1,128})"', "deepseek_v32"),)),
    # <minimax:tool_call><invoke name="NAME"> (quoted either way, or not)
    Family("minimax_m2", starts=("<minimax:tool_call>",),
           names=(_reader(r"<invoke\s+name=[\"']?([^\"'>\s]{1,128})", "minimax_m2"),)),
    # [TOOL_CALLS][{"name": ...}] (before v11), [TOOL_CALLS]NAME[ARGS]{...} or NAME{...} (v11+)
    Family("mistral", starts=("[TOOL_CALLS]",), names=(
        _json("mistral"),
        _reader(r"\A\s*([^\s\[{\"]{1,128}?)\s*(?:\[ARGS\]|\[CALL_ID\]|\{)", "mistral"),
    )),
    # gpt-oss (harmony): <|start|>assistant<|channel|>commentary to=functions.NAME ...<|call|>
    Family("openai", ends=("<|call|>",), look_back_to=("<|start|>",),
           names=(_reader(r"to=(?:functions\.)?([^\s<>]{1,128})", "openai"),)),
    # Llama 3.x built-in tools: <|python_tag|>brave_search.call(...) or JSON, then <|eom_id|>
    Family("llama3_json", starts=("<|python_tag|>",), ends=("<|eom_id|>",),
           look_back_to=("<|python_tag|>",), names=(
               _json("llama3_json"),
               _reader(r"\A\s*([A-Za-z_]\w{0,127})\.call\(", "llama3_json"),
           )),
    # Llama 4: <|python_start|>[NAME(...)]<|python_end|>, only as the message's start
    Family("llama4_pythonic", starts=("<|python_start|>",), first_only=True,
           names=(_reader(r"\A\s*\[?\s*([A-Za-z_]\w{0,127})\(", "llama4_pythonic"),)),
    # Gemma 4: <|tool_call>call:NAME{...}<tool_call|> (some checkpoints: <|tool_call>:NAME{...})
    Family("gemma4", starts=("<|tool_call>",),
           names=(_reader(r"\A\s*(?:call)?:([^\s{(<>]{1,128})", "gemma4"),)),
    # Seed-OSS: <seed:tool_call><function=NAME>...
    Family("seed_oss", starts=("<seed:tool_call>",), names=(NameReader(FUNCTION_TAG, "seed_oss"),)),
    # Granite 3.0: <|tool_call|>[{"name": ...}]
    Family("granite", starts=("<|tool_call|>",), names=(_json("granite"),)),
    # Granite 20B FC: <function_call>{"name": ...}
    Family("granite-20b-fc", starts=("<function_call>",), names=(_json("granite-20b-fc"),)),
    # FunctionGemma: <start_function_call>call:NAME{...}<end_function_call>
    Family("functiongemma", starts=("<start_function_call>",),
           names=(_reader(r"\A\s*call:(\w{1,128})", "functiongemma"),)),
)
FAMILY = {family.name: family for family in FAMILIES}


@dataclass(frozen=True)
class TextFormat:
    name: str
    pattern: re.Pattern  # matched at the start of the message; group 1 is the name


TEXT_FORMATS: dict[str, TextFormat] = {
    # {"name": "bash", "parameters": {...}} (Llama 3.1-3.3, 4 in JSON mode)
    "llama3_json": TextFormat("llama3_json", re.compile(
        r"\A\s*(?:<\|python_tag\|>)?" + JSON_NAME.pattern.removeprefix(r"\A"))),
    # [bash(command="ls"), ...] (Llama 3.2 / 4 pythonic, ToolACE)
    "pythonic": TextFormat("pythonic", re.compile(
        r"\A\s*(?:<\|python_start\|>)?\s*\[\s*([A-Za-z_]\w{0,127})\(")),
    # OLMo 3: calls one per line, optionally in <function_calls>...</function_calls>
    "olmo3": TextFormat("olmo3", re.compile(
        r"\A\s*(?:<function_calls>)?\s*\[?\s*([A-Za-z_]\w{0,127})\((?:\s*\)|\s*[A-Za-z_]\w*\s*=)")),
    # xLAM: a JSON list of calls, maybe fenced or after [TOOL_CALLS] / <tool_call> as text
    "xlam": TextFormat("xlam", re.compile(
        r"\A\s*(?:```(?:json)?\s*)?(?:\[TOOL_CALLS\]|<tool_call>)?"
        + JSON_NAME.pattern.removeprefix(r"\A"))),
}


@dataclass(frozen=True)
class Parser:
    """What one vLLM `--tool-call-parser` brings: its families' markers (also
    when the tokenizer spells them as text) and a text format."""

    families: tuple[str, ...] = ()
    text: str | None = None


PARSERS: dict[str, Parser] = {
    **{name: Parser(("hermes",)) for name in (
        "hermes", "qwen3_json", "qwen3_coder", "qwen3_xml", "glm45", "glm47", "ernie45",
        "granite4")},
    "kimi_k2": Parser(("kimi_k2",)),
    "deepseek_v3": Parser(("deepseek_v3",)),
    "deepseek_v31": Parser(("deepseek_v3",)),
    **{name: Parser(("deepseek_v32",)) for name in ("deepseek_v32", "deepseek_v4", "deepseek_v41")},
    "minimax_m2": Parser(("minimax_m2",)),
    "mistral": Parser(("mistral",)),
    "openai": Parser(("openai",)),
    "llama3_json": Parser(("llama3_json",), "llama3_json"),
    "llama4_json": Parser(("llama3_json",), "llama3_json"),
    "pythonic": Parser((), "pythonic"),
    "llama4_pythonic": Parser(("llama4_pythonic",), "pythonic"),
    "olmo3": Parser((), "olmo3"),
    "gemma4": Parser(("gemma4",)),
    "seed_oss": Parser(("seed_oss",)),
    # Granite 3.1 writes <tool_call> as text, 3.0 <|tool_call|> as a token.
    "granite": Parser(("granite", "hermes")),
    "granite-20b-fc": Parser(("granite-20b-fc",)),
    "functiongemma": Parser(("functiongemma",)),
    "xlam": Parser(("mistral", "hermes"), "xlam"),
}
