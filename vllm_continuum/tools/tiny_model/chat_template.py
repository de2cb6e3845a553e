"""The tiny model's chat template: Qwen2.5-Instruct's, with Hermes tool calls.

vLLM renders chat requests with it and `--tool-call-parser hermes` parses
what it lays out, so a random-weight model can take part in tool-calling
conversations like a trained Qwen2.5 one.
"""

# Qwen2.5-Instruct's template (Hermes tool format), made tolerant of
# ``content: null`` and of arguments given as a JSON string or an object.
CHAT_TEMPLATE = r"""{%- macro text(c) -%}
{%- if c is none -%}{%- elif c is string -%}{{- c -}}
{%- else -%}{%- for part in c -%}{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- text(messages[0]['content']) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + text(messages[0]['content']) + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + text(message.content) }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- text(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501

# Kimi K2's chat layout (moonshotai/Kimi-K2-Instruct's template, trimmed to
# what the tiny model needs): tools declared up front, a role token and
# <|im_middle|> per message, tool calls in the tool-calls section with their
# ids (functions.NAME:IDX), tool results as "## Return of ID".
KIMI_K2_TEMPLATE = r"""{%- macro text(c) -%}
{%- if c is none -%}{%- elif c is string -%}{{- c -}}
{%- else -%}{%- for part in c -%}{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson) + '<|im_end|>' -}}
{%- endif -%}
{%- if messages[0]['role'] != 'system' -%}
    {{- '<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}{{- '<|im_system|>system<|im_middle|>' -}}
    {%- elif message.role == 'user' -%}{{- '<|im_user|>user<|im_middle|>' -}}
    {%- elif message.role == 'assistant' -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}
    {%- else -%}{{- '<|im_system|>tool<|im_middle|>' -}}
    {%- endif -%}
    {%- if message.role == 'assistant' and message.tool_calls -%}
        {{- text(message.content) + '<|tool_calls_section_begin|>' -}}
        {%- for tool_call in message.tool_calls -%}
            {%- set arguments = tool_call.function.arguments -%}
            {{- '<|tool_call_begin|>' + tool_call.id + '<|tool_call_argument_begin|>' -}}
            {{- arguments if arguments is string else (arguments | tojson) -}}
            {{- '<|tool_call_end|>' -}}
        {%- endfor -%}
        {{- '<|tool_calls_section_end|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '## Return of ' + (message.tool_call_id or '') + '\n' + text(message.content) -}}
    {%- else -%}
        {{- text(message.content) -}}
    {%- endif -%}
    {{- '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' -}}
{%- endif -%}
"""  # noqa: E501
